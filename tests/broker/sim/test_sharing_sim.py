"""The GPU-sharing replay: trace reading, FGD's inflation, hand-checked curves, and the shared trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.sharing import ClusterTraceError, Pod, inflate, read_nodes, read_pods, replay
from policies import kinds
from policies.sharing import SharingNode, TaskShape

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,2,T4\nn1,8000,32768,2,T4\n"


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_reads_the_published_columns_and_ignores_the_rest(tmp_path: Path) -> None:
    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    assert nodes == [SharingNode("n0", 8000, 32768, 2, "T4"), SharingNode("n1", 8000, 32768, 2, "T4")]
    pods = read_pods(write(tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
                                              "p0,1000,1024,1,500,,LS\np1,0,0,2,1000,T4,BE\np2,500,10,0,0,,LS\n"),
                     nodes)
    assert [p.shape for p in pods] == [TaskShape(1000, 1024, 1, 500), TaskShape(0, 0, 2, 1000, 0, ("T4",)),
                                       TaskShape(500, 10, 0, 0)]


def test_reads_the_five_column_layout_of_the_multigpu_lists(tmp_path: Path) -> None:
    # As published for openb_pod_list_multigpu*: no gpu_spec, so every pod takes any GPU model.
    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    pods = read_pods(write(tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                              "p0,12000,16384,1,460\np1,4000,8192,2,1000\np2,500,10,0,0\n"), nodes)
    assert [p.shape for p in pods] == [TaskShape(12000, 16384, 1, 460), TaskShape(4000, 8192, 2, 1000),
                                       TaskShape(500, 10, 0, 0)]


def test_a_gpu_spec_is_a_set_of_models(tmp_path: Path) -> None:
    nodes = read_nodes(write(tmp_path, "n.csv", NODES + "n2,8000,32768,4,V100M16\nn3,8000,32768,4,V100M32\n"))
    pods = read_pods(write(tmp_path, "p.csv", HEAD + "a,1,1,1,1000,V100M32|V100M16|V100M32\n"
                                              "b,1,1,1,1000,V100M16|V100M32\n"), nodes)
    assert pods[0].shape == pods[1].shape
    assert pods[0].shape.gpu_types == ("V100M16", "V100M32")


def test_hand_checked_curve_on_a_tiny_cluster(tmp_path: Path) -> None:
    # 4 GPUs. Tasks in order: 0.5, 0.5, 1, 1, 1 (0.5 + 0.5 share a GPU under fgd): all fit until the
    # last whole GPU, which finds none. Arrived 10 % = 0.4 GPU: after the first task.
    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    half, whole = TaskShape(0, 0, 1, 500), TaskShape(0, 0, 1, 1000)
    tasks = [Pod("a", half), Pod("b", half), Pod("c", whole), Pod("d", whole), Pod("e", whole), Pod("f", whole)]
    r = replay(tasks, nodes, "fgd", kinds.sharing.get("fgd"), until=1.3)
    # arrived after each task: 12.5, 25, 50, 75, 100, 125 %; allocated: 0.5, 1, 2, 3, 4, 4 GPUs.
    assert [(p.arrived_pct, p.unallocated_gpu_pct) for p in r.curve] == [
        (10, 87.5), (20, 75.0), (30, 50.0), (40, 50.0), (50, 50.0), (60, 25.0), (70, 25.0), (80, 0.0),
        (90, 0.0), (100, 0.0), (110, 0.0), (120, 0.0), (130, 0.0)]
    assert (r.failed_tasks, r.allocated_gpu_pct, r.unallocated_gpu_pct) == (1, 100.0, 0.0)
    # Spreading the halves over two GPUs (first_fit puts both on GPU 0 too; random may not).
    r = replay(tasks, nodes, "first_fit", kinds.sharing.get("first_fit"))
    assert r.failed_tasks == 1


def test_inflation_tops_up_to_the_target_and_is_seeded() -> None:
    pods = [Pod(f"p{i}", TaskShape(0, 0, 1, 250 * (1 + i % 4))) for i in range(8)]  # 5 GPUs requested
    tasks = inflate(pods, 8000, 1.3, seed=3)
    total = sum(t.shape.total_gpu_milli for t in tasks)
    assert 10400 - 1000 < total <= 10400
    assert {p.name for p in pods} <= {t.name for t in tasks}
    assert [t.name for t in tasks] == [t.name for t in inflate(pods, 8000, 1.3, seed=3)]
    assert [t.name for t in tasks] != [t.name for t in inflate(pods, 8000, 1.3, seed=4)]
    thinned = inflate(pods, 8000, 0.25, seed=3)  # 2 GPUs: pods removed at random
    assert sum(t.shape.total_gpu_milli for t in thinned) <= 2000


BAD_NODES = [
    ("sn,cpu_milli,memory_mib,gpu\nn0,1,1,1\n", "row 1: missing column(s) model"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,abc,1,1,T4\n", "row 2: cpu_milli: expected a whole number"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,-2,T4\n", "row 2: gpu: -2 is out of range"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1e300,1,1,T4\n", "row 2: cpu_milli: "),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,nan,1,1,T4\n", "row 2: cpu_milli: expected a whole number"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,9999999999999999999999,T4\n", "row 2: gpu: "),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1,T4\nn0,1000,1,1,T4\n", "row 3: sn: 'n0' appears twice"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1,\n", "row 2: model: empty"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1\n", "row 2: expected 5 columns"),
    ("sn,cpu_milli,memory_mib,gpu,model\n", "no nodes"),
    ("", "row 1: missing column(s)"),
    (b"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1,T4\nn1,10\x0000,1,1,T4\n", "row 3: contains a NUL byte"),
    (b"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1,\xff\xfe\n", "row 2: not UTF-8"),
]


@pytest.mark.parametrize(("text", "message"), BAD_NODES)
def test_bad_node_lists_name_the_row_and_column(tmp_path: Path, text: str | bytes, message: str) -> None:
    path = write(tmp_path, "nodes.csv", text)
    with pytest.raises(ClusterTraceError) as info:
        read_nodes(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
BAD_PODS = [
    ("name,cpu_milli,num_gpu\np,1,1\n", "row 1: missing column(s) memory_mib, gpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n", "row 1: missing column(s) gpu_milli"),
    (HEAD + "p,1000,1,1,500\n", "row 2: expected 6 columns"),
    (HEAD + "p,1000,1,1,500,,\n", "row 2: expected 6 columns"),
    (HEAD + "p,1000,-1,1,500,\n", "row 2: memory_mib: -1 is out of range"),
    (HEAD + "p,1000,1,65,1000,\n", "row 2: num_gpu: 65 is out of range"),
    (HEAD + "p,99999999999,1,1,1000,\n", "row 2: cpu_milli: 99999999999 is out of range"),
    (HEAD + "p,inf,1,1,1000,\n", "row 2: cpu_milli: expected a whole number"),
    ((HEAD + "p,1,1,1,100,").encode() + b"\xed\xb2\x80\n", "row 2: not UTF-8"),  # a lone surrogate
    (HEAD + "p\x07,1,1,1,100,\n", "row 2: name: contains control characters"),
    (HEAD + "p,1,1,1,100,|||\nq,1,1,1,100,T4|\nr,1,1,1,100,G2\n", "row 4: gpu_spec: no node has GPU type 'G2'"),
    (HEAD + "p,1000,1,1,1500,\n", "row 2: gpu_milli: 1500 is out of range 0..1000"),
    (HEAD + "p,1000,1,2,500,\n", "row 2: gpu_milli: a share of 500 is for one GPU only, not 2"),
    (HEAD + "p,1000,1,0,500,\n", "row 2: gpu_milli: 500 for a pod with num_gpu 0"),
    (HEAD + "p,1000,1,1,0,\n", "row 2: gpu_milli: 0 for a pod with num_gpu 1"),
    (HEAD + "p,-5,1,1,100,\n", "row 2: cpu_milli: -5 is out of range"),
    (HEAD + "p,1,1,1,100,A100\n", "row 2: gpu_spec: no node has GPU type 'A100'"),
    (HEAD + "p,1,1,1,100,T4|H100\n", "row 2: gpu_spec: no node has GPU type 'H100'"),
    (HEAD + ",1,1,1,100,\n", "row 2: name: empty"),
    (HEAD + "p,1,1,1,1e3000,\n", "row 2: gpu_milli: expected a whole number"),
    (HEAD + 'p,"1\n', "row 2: "),
]


@pytest.mark.parametrize(("text", "message"), BAD_PODS)
def test_bad_pod_lists_name_the_row_and_column(tmp_path: Path, text: str | bytes, message: str) -> None:
    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    path = write(tmp_path, "pods.csv", text)
    with pytest.raises(ClusterTraceError) as info:
        read_pods(path, nodes)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_pod_list_with_nul_bytes_is_refused_with_the_row(tmp_path: Path) -> None:
    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    path = write(tmp_path, "pods.csv", (HEAD + "p,1,1,1,100,\nq,1,1\x00,1,100,\n").encode())
    with pytest.raises(ClusterTraceError, match="row 3: contains a NUL byte"):
        read_pods(path, nodes)


@pytest.mark.slow
def test_a_million_row_pod_list_is_refused_at_the_row_past_the_limit(tmp_path: Path) -> None:
    import broker.sim.sharing as sharing

    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    path = write(tmp_path, "pods.csv", HEAD + "p,1,1,1,100,\n" * 1_000_000)
    limit = sharing.MAX_POD_ROWS
    with pytest.raises(ClusterTraceError, match=f"row {limit + 2}: more than {limit} rows"):
        read_pods(path, nodes)


def test_a_huge_pod_list_is_refused_by_rows_without_reading_it_all(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.sim.sharing as sharing

    monkeypatch.setattr(sharing, "MAX_ROWS", 100)
    nodes = read_nodes(write(tmp_path, "n.csv", NODES))
    path = write(tmp_path, "pods.csv", HEAD + "p,1,1,1,100,\n" * 500)
    with pytest.raises(ClusterTraceError, match="row 102: more than 100 rows"):
        read_pods(path, nodes)
    monkeypatch.setattr(sharing, "MAX_FILE_BYTES", 1000)
    with pytest.raises(ClusterTraceError, match="bytes is more than"):
        read_pods(path, nodes)


def test_an_inflation_too_big_to_replay_is_refused() -> None:
    pods = [Pod("tiny", TaskShape(0, 0, 1, 1))]  # a thousandth of a GPU
    with pytest.raises(ClusterTraceError, match="more than the 200000 a replay may have; lower --until"):
        inflate(pods, 64 * 1000 * 1000, 1.3, seed=0)


@pytest.mark.traces
def test_the_alibaba_trace_fgd_beats_best_fit_early_on(shared_traces: Path) -> None:
    folder = shared_traces / "alibaba-openb"
    nodes = read_nodes(folder / "openb_node_list_gpu_node.csv")
    pods = read_pods(folder / "openb_pod_list_default.csv", nodes)
    assert (len(nodes), len(pods), sum(n.gpus for n in nodes)) == (1213, 8152, 6212)
    tasks = inflate(pods, 6212 * 1000, 1.3, seed=42)
    assert 8075_600 - 8000 < sum(t.shape.total_gpu_milli for t in tasks) <= 8075_600
    # The first 2,000 tasks only (the whole replay is the benchmark's job): a sanity check that both
    # policies run on the real cluster and never over-allocate it.
    head = tasks[:2000]
    for name in ("fgd", "best_fit"):
        r = replay(head, nodes, name, kinds.sharing.get(name), seed=42)
        assert r.failed_tasks == 0
        assert 0 < r.allocated_gpu_pct < 100


@pytest.mark.traces
def test_every_published_pod_list_reads(shared_traces: Path) -> None:
    folder = shared_traces / "alibaba-openb"
    nodes = read_nodes(folder / "openb_node_list_gpu_node.csv")
    lists = sorted(folder.glob("openb_pod_list_*.csv"))
    assert len(lists) >= 12
    for path in lists:
        pods = read_pods(path, nodes)
        assert 8000 <= len(pods) <= 10_000, path.name
        typed = sum(1 for p in pods if p.shape.gpu_types)
        if "gpuspec" in path.name:
            assert typed > 0, path.name
        else:
            assert typed == 0, path.name
