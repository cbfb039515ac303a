"""A Hugging Face Transformers ``Trainer`` job keeping the broker's checkpoint contract.

A tiny GPT-2 built from a config (no downloaded weights) learns a synthetic token sequence made on
the spot (no downloaded data set). The Trainer saves its model, optimizer, scheduler and random
states; ``broker.job.huggingface`` makes the save happen when the broker asks and resumes from it,
so a resumed run ends bit-identical to an uninterrupted one on the CPU. It prints the SHA-256 of the
final parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from broker.job.huggingface import BrokerTrainerCallback


class Sequences(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``count`` token sequences, each drawn from a generator seeded by its index."""

    def __init__(self, count: int = 256, length: int = 16, vocab: int = 64) -> None:
        self.count, self.length, self.vocab = count, length, vocab

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = int(torch.randint(self.vocab, (1,), generator=torch.Generator().manual_seed(index)))
        ids = (torch.arange(self.length) * 3 + start) % self.vocab
        return {"input_ids": ids, "labels": ids}


class Pace(TrainerCallback):  # type: ignore[misc]
    """Stretch each step to ``seconds`` (stands for GPU time)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.began = seconds, time.monotonic()

    def on_step_begin(self, *args: object, **kwargs: object) -> None:
        self.began = time.monotonic()

    def on_step_end(self, *args: object, **kwargs: object) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.began)))


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def parameters_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def arguments(output_dir: str, steps: int) -> TrainingArguments:
    return TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=8,
                             learning_rate=1e-3, seed=0, full_determinism=True, use_cpu=True, save_strategy="no",
                             logging_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    args = parser.parse_args()

    broker_ckpt = BrokerTrainerCallback(every_steps=args.checkpoint_every)
    model = tiny_model()
    trainer = Trainer(model=model, args=arguments(broker_ckpt.output_dir, args.steps), train_dataset=Sequences(),
                      callbacks=[broker_ckpt, Pace(args.step_seconds)])
    resume = broker_ckpt.resume_path()
    print(f"resumed from {resume}" if resume else "starting fresh", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        print(f"done: {trainer.state.global_step} steps, parameters sha256 {parameters_digest(model)}", flush=True)


if __name__ == "__main__":
    main()
