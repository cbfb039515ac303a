"""Multi-document job files: SkyPilot's pipelines (stages one after another) and job groups (together)."""

from __future__ import annotations

import pytest

from broker.spec.job import Pipeline, SpecError, parse_job_file, parse_job_spec

CHAIN = "name: etl\n---\nname: prep\nrun: x\n---\nname: train\nresources:\n  accelerators: {L4, A10G}\nrun: y\n"


def test_a_chain_has_a_typed_stage_per_document() -> None:
    pipeline = parse_job_file(CHAIN, source="etl.yaml", offline=True)
    assert isinstance(pipeline, Pipeline)
    assert (pipeline.name, pipeline.kind, pipeline.header) == ("etl", "chain", {"name": "etl"})
    assert [s.name for s in pipeline.stages] == ["prep", "train"]
    assert [a.name for a in pipeline.stages[1].accelerators] == ["L4", "A10G"]


def test_without_a_header_every_document_is_a_stage_named_after_the_file() -> None:
    pipeline = parse_job_file("run: a\n---\nrun: b\n", source="two.yaml", offline=True)
    assert isinstance(pipeline, Pipeline)
    assert [s.name for s in pipeline.stages] == ["two-0", "two-1"]


def test_a_job_group_runs_together() -> None:
    text = "name: grp\nexecution: parallel\n---\nname: trainer\nrun: t\n---\nname: server\nrun: s\n"
    pipeline = parse_job_file(text, source="grp.yaml", offline=True)
    assert isinstance(pipeline, Pipeline) and pipeline.kind == "group"
    assert [s.name for s in pipeline.stages] == ["trainer", "server"]


def test_a_bad_stage_is_named_with_its_line_in_the_whole_file() -> None:
    text = CHAIN.replace("{L4, A10G}", "H1OO:8")
    with pytest.raises(SpecError) as caught:
        parse_job_file(text, source="etl.yaml", offline=True)
    error = caught.value
    assert (error.field, error.line) == ("resources.accelerators", 8)
    assert str(error).startswith("etl.yaml (stage 2):8:") and "did you mean 'H100'?" in str(error)


def test_each_stage_has_its_own_broker_section() -> None:
    text = "name: p\n---\nrun: a\nbroker:\n  priority: 10000000\n"
    with pytest.raises(SpecError) as caught:
        parse_job_file(text + "---\nrun: b\n", source="p.yaml", offline=True)
    assert (caught.value.field, caught.value.line) == ("broker.priority", 5)


def test_a_header_with_a_wrong_execution_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_file("name: p\nexecution: sideways\n---\nrun: a\n", source="p.yaml", offline=True)
    assert (caught.value.field, caught.value.line) == ("execution", 2)


def test_a_one_task_reader_refuses_a_pipeline_in_one_line_and_points_at_launch() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(CHAIN, source="etl.yaml", offline=True)
    message = str(caught.value)
    assert "\n" not in message
    assert "a pipeline of 2 stages (prep, train)" in message
    assert "`broker launch` runs a pipeline" in message
