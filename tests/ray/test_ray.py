"""tblock.ray on a local Ray and on a two-node cluster (ray.cluster_utils.Cluster).

Expected values come from ``model.generate`` on each prompt alone, in this process (the
batcher's contract), never from what the actors returned: Generator through
``map_batches``, ``run_ray_job`` writing a JobOutput (resuming one, in both orders), and a
job whose first actor dies in the middle of a batch (Ray restarts it and retries the
batch; every id is written once).  ``make test-ray`` runs this; plain pytest does not.
"""

import json
import os
import sys

import numpy as np
import pytest
from test_generate import VOCAB, ckpt  # noqa: F401  (ckpt: test_generate's random checkpoint, a fixture)

import tblock
from tblock.jobs import JobOutput, read_requests, record_of

ray = pytest.importorskip("ray", reason="tblock.ray needs the ray extra: make test-ray installs it")
import ray.data  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tblock.ray import Generator, actor_threads, run_ray_job  # noqa: E402

pytestmark = pytest.mark.ray

# the actors' classes below go to the workers by value: they cannot import this file
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STORE = 80 * 2 ** 20        # each node's object store: the rows are a few KB


@pytest.fixture(scope="module")
def model(ckpt):
    return tblock.load(ckpt)


@pytest.fixture(scope="module", params=["local", "two-nodes"])
def cluster(request):
    """A local Ray of 2 CPUs, or a head and a second node of 1 CPU each; "two-nodes"
    yields the node count so tests can check that both nodes worked."""
    if request.param == "local":
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=STORE)
        yield 1
        ray.shutdown()
        return
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "object_store_memory": STORE})
    c.add_node(num_cpus=1, object_store_memory=STORE)
    ray.init(address=c.address)
    c.wait_for_nodes()
    yield 2
    ray.shutdown()
    c.shutdown()


def prompts_of(seed: int, n: int) -> list[list[int]]:
    """n prompts of mixed lengths 1..14."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, int(rng.integers(1, 15))).tolist() for _ in range(n)]


def write_input(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


DEFAULTS = {"max_new_tokens": 12, "temperature": 0.0, "top_k": None, "top_p": None, "seed": 7, "eos": None}


def job_rows(n: int) -> list[dict]:
    """Input lines: greedy ones, seeded and derived-seed sampling, their own lengths and eos."""
    rows = []
    for i, ids in enumerate(prompts_of(5, n)):
        row = {"id": f"p{i}" if i % 3 else i, "ids": ids}
        if i % 4 == 1:
            row.update(temperature=0.9, seed=1000 + i)
        elif i % 4 == 2:
            row.update(temperature=1.2, top_k=20)              # seed derived from the base seed
        elif i % 4 == 3:
            row.update(max_new_tokens=3 + i % 7, top_p=0.8, temperature=1.0)
        if i % 5 == 0:
            row["eos"] = int(ids[-1])
        rows.append(row)
    return rows


def expected_records(model, requests) -> list[dict]:
    """Each request's record from generate on its prompt alone."""
    return [record_of(r, model.generate(r.ids, **r.generate_kwargs())) for r in requests]


def read_records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------------- Generator


def test_generator_outside_ray_reads_columns_and_params(ckpt, model):
    """A batch called directly: per-row columns, nulls (None, NaN) keeping the keyword's
    value, and the JSON "params" column, each row equal to generate alone."""
    prompts = prompts_of(1, 6)
    gen = Generator(ckpt, max_new_tokens=6, temperature=0.0, eos_token_id=None, threads=1)
    assert gen.threads == 1
    batch = {"ids": np.array([np.array(p) for p in prompts], dtype=object),
             "temperature": np.array([0.0, 0.8, np.nan, 1.1, 0.0, 0.7]),
             "seed": np.array([None, 11, None, 12, None, 13], dtype=object),
             "params": np.array([json.dumps(p) for p in ({}, {"top_k": 5}, {"max_new_tokens": 2}, {"seed": 2 ** 62 + 1},
                                                         {"eos_token_id": 3}, {"top_p": 0.5, "max_new_tokens": 9})])}
    out = gen(batch)
    want_kw = [dict(temperature=0.0), dict(temperature=0.8, seed=11, top_k=5), dict(temperature=0.0, max_new_tokens=2),
               dict(temperature=1.1, seed=2 ** 62 + 1), dict(temperature=0.0, eos_token_id=3),
               dict(temperature=0.7, seed=13, top_p=0.5, max_new_tokens=9)]
    for p, kw, new, stop in zip(prompts, want_kw, out["new_ids"], out["stop"]):
        kw = {"max_new_tokens": 6, **kw}
        want = model.generate(p, **kw)[len(p):]
        np.testing.assert_array_equal(new, want)
        eos = kw.get("eos_token_id")
        assert stop == ("eos" if eos is not None and len(want) and want[-1] == eos else "length")
    assert out["ids"] is batch["ids"]                      # the input columns come back as they were


def test_generator_refuses_bad_batches(ckpt):
    gen = Generator(ckpt, max_new_tokens=2, temperature=0.0, threads=1)
    with pytest.raises(ValueError, match='"ids" column'):
        gen({"prompt": np.array(["a"])})
    with pytest.raises(ValueError, match="unknown parameter 'tempo'"):
        gen({"ids": np.array([[1, 2]]), "params": np.array(['{"tempo": 1}'])})
    with pytest.raises(ValueError, match="prompts\\[0\\]"):
        gen({"ids": np.array([[1, VOCAB]])})               # a token id past the vocabulary


def test_actor_threads_follow_the_cpus_ray_assigns(cluster):
    """An actor (task) given 2 CPUs runs tblock on 2 threads; 1 CPU, one thread."""
    ncpu = 2 if cluster == 1 else 1
    got = ray.get(ray.remote(num_cpus=ncpu)(lambda: (actor_threads(), tblock.get_num_threads())).remote())
    assert got[0] == ncpu
    assert actor_threads(3) == min(3, __import__("numba").config.NUMBA_NUM_THREADS)


def test_map_batches_equals_generate(cluster, ckpt, model):
    prompts = prompts_of(2, 9)
    rows = [{"ids": p, "temperature": 0.0 if i % 2 else 1.0, "seed": i} for i, p in enumerate(prompts)]
    ds = ray.data.from_items(rows, override_num_blocks=3)
    out = ds.map_batches(Generator, fn_constructor_kwargs={"model_path": str(ckpt), "max_new_tokens": 10},
                         compute=ray.data.ActorPoolStrategy(size=cluster), num_cpus=1, batch_size=None,
                         batch_format="numpy").take_all()
    assert len(out) == len(rows)
    by_prompt = {tuple(int(t) for t in r["ids"]): r for r in out}
    for i, p in enumerate(prompts):
        want = model.generate(p, 10, temperature=rows[i]["temperature"], seed=i)[len(p):]
        np.testing.assert_array_equal(by_prompt[tuple(p)]["new_ids"], want)


# ----------------------------------------------------------------------------- the file job


def requests_of(tmp_path, model, rows):
    write_input(tmp_path / "in.jsonl", rows)
    return read_requests(tmp_path / "in.jsonl", model, None, DEFAULTS, "fail")


@pytest.mark.parametrize("order", ["input", "done"])
def test_job_equals_generate_and_resumes(cluster, tmp_path, ckpt, model, order):
    """run_ray_job writes every request once, as generate gives it alone; with records
    already in OUT it writes only the others (a resumed job); "input" keeps input order."""
    requests = requests_of(tmp_path, model, job_rows(14))
    want = expected_records(model, requests)
    out_path = tmp_path / "out.jsonl"
    with JobOutput(out_path, {"job": "test"}) as out:
        for rec in want[:4]:                    # an earlier run's records
            out.write(rec)
    seen = []
    with JobOutput(out_path, {"job": "test"}) as out:
        n = run_ray_job(ckpt, requests, out, order=order, max_batch=4, on_record=seen.append)
    assert n == len(requests) - 4 and len(seen) == n
    got = read_records(out_path)
    if order == "input":
        assert got == want
    else:
        assert got[:4] == want[:4]
        assert sorted(got[4:], key=lambda r: str(r["id"])) == sorted(want[4:], key=lambda r: str(r["id"]))
    with JobOutput(out_path, {"job": "test"}) as out:
        assert run_ray_job(ckpt, requests, out) == 0        # nothing left: Ray is not even asked


class NodeRecorder(Generator):
    """Generator that appends its node's id to the file ``nodes`` when its actor starts."""

    def __init__(self, model_path, nodes, **kw):
        super().__init__(model_path, **kw)
        with open(nodes, "a") as f:
            f.write(ray.get_runtime_context().get_node_id() + "\n")


def test_job_on_every_node_of_the_cluster(cluster, tmp_path, ckpt, model):
    """By default one actor per node: on the two-node cluster an actor starts on each (which
    of them gets the batches is Ray Data's affair, so the test counts the actors' nodes)."""
    requests = requests_of(tmp_path, model, job_rows(8))
    nodes = tmp_path / "nodes"
    with JobOutput(tmp_path / "out.jsonl", {"job": "test"}) as out:
        run_ray_job(ckpt, requests, out, generator=NodeRecorder, nodes=str(nodes), batch_size=2)
    assert read_records(tmp_path / "out.jsonl") == expected_records(model, requests)
    assert len(set(nodes.read_text().split())) == cluster


class DiesOnce(Generator):
    """The first call of the whole job (the one that creates ``marker``) finishes one
    prompt, then kills its actor's process."""

    def __init__(self, model_path, marker, **kw):
        super().__init__(model_path, **kw)
        self.marker = marker

    def __call__(self, batch):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return super().__call__(batch)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        super().__call__({k: v[:1] for k, v in batch.items()})     # part of the batch done
        os._exit(1)


def test_actor_killed_mid_batch_loses_and_duplicates_nothing(cluster, tmp_path, ckpt, model):
    requests = requests_of(tmp_path, model, job_rows(12))
    marker = tmp_path / "died"
    with JobOutput(tmp_path / "out.jsonl", {"job": "test"}) as out:
        n = run_ray_job(ckpt, requests, out, generator=DiesOnce, marker=str(marker), batch_size=3, max_batch=2)
    assert marker.is_file()                                     # an actor did die
    assert n == len(requests)
    got = read_records(tmp_path / "out.jsonl")
    assert [r["id"] for r in got] == [r.id for r in requests]   # each once, in input order
    assert got == expected_records(model, requests)


# ----------------------------------------------------------------------------- tblock generate --ray


def test_run_job_args_reads_the_generate_options(cluster, tmp_path, ckpt, model):
    """The batch job's --ray branch: the subcommand's options reach the actors (order,
    max_batch, cache, weights, dot) and each record counts its new tokens for the progress."""
    from argparse import Namespace

    from tblock.ray import run_job_args
    requests = requests_of(tmp_path, model, job_rows(6))
    args = Namespace(ray="", order="input", backend=None, cache="bf16", max_batch=2, weights="int8", dot="fp32")
    counted = []
    with JobOutput(tmp_path / "out.jsonl", {"job": "test"}) as out:
        assert run_job_args(args, ckpt, requests, out, None, counted.append) == len(requests)
    quantized = tblock.load(ckpt, weights="int8", dot="fp32")
    want = [record_of(r, quantized.generate(r.ids, **r.generate_kwargs(), cache_format="bf16")) for r in requests]
    got = read_records(tmp_path / "out.jsonl")
    assert got == want
    assert counted == [len(r["new_ids"]) for r in want]


def has_ray_flag() -> bool:
    from tblock.cli import build_parser
    args, unknown = build_parser().parse_known_args(["generate", "model", "--ids", "1", "--ray"])
    return not unknown


@pytest.mark.skipif(not has_ray_flag(), reason="tblock generate has no --ray option in this checkout's cli.py")
def test_cli_ray_job_equals_the_local_job_and_resumes_it(cluster, tmp_path, ckpt, capsys):
    """`tblock generate --input --output --ray` writes the local job's file byte for byte,
    and finishes a local job cut short (its last records gone)."""
    from tblock.cli import main as cli_main
    write_input(tmp_path / "in.jsonl", job_rows(10))
    common = ["generate", str(ckpt), "--input", str(tmp_path / "in.jsonl"), "-n", "9", "--seed", "3",
              "--max-batch", "3"]
    assert cli_main(common + ["--output", str(tmp_path / "local.jsonl")]) == 0
    assert cli_main(common + ["--output", str(tmp_path / "ray.jsonl"), "--ray"]) == 0
    local = (tmp_path / "local.jsonl").read_bytes()
    assert (tmp_path / "ray.jsonl").read_bytes() == local
    lines = local.splitlines(keepends=True)
    (tmp_path / "local.jsonl").write_bytes(b"".join(lines[:6]) + lines[6][:5])     # killed mid-write
    capsys.readouterr()
    assert cli_main(common + ["--output", str(tmp_path / "local.jsonl"), "--ray"]) == 0
    assert "6 already in" in capsys.readouterr().err
    assert (tmp_path / "local.jsonl").read_bytes() == local
