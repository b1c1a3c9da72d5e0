# Data parallelism from Python: the keywords (checked as the command line checks its flags),
# regen.world() in a process alone, and, with MPI built and mpiexec present, two ranks of a script
# under mpirun: the same loss on both, every shard mode the same parameters, and an uncaught
# exception on one rank ending the job with a message naming it.
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import regen


@pytest.mark.parametrize("kwargs,match", [
    (dict(shard="stage3"), r"^shard='stage3': must be none, optimizer, gradients or parameters"),
    (dict(bucket_size=100), r"^bucket_size=100: must be an integer from 1024"),
    (dict(bucket_size="lots"), r"^bucket_size='lots'"),
    (dict(shard=3), r"^shard=3: must be a str"),
])
def test_bad_data_parallel_options(kwargs, match):
    with pytest.raises(regen.Error, match=match):
        regen.Model("resnet-tiny", batch=2, device="cpu", **kwargs)


def test_world_alone():
    w = regen.world()
    assert (w["rank"], w["size"], w["mpi"]) == (0, 1, False)
    # Alone, the data-parallel options change nothing: a model trains as without them.
    m = regen.Model("resnet-tiny", batch=2, device="cpu", shard="gradients", bucket_size="64KiB")
    assert len(m.train(1)) == 1


SCRIPT = textwrap.dedent("""
    import sys, numpy as np, regen
    w = regen.world()
    out = {}
    for shard in ("none", "optimizer", "gradients"):
        m = regen.Model("transformer-tiny", batch=4, device="cpu", threads=1, shard=shard,
                        bucket_size="16KiB", dropout=0.0)
        # One log, written by rank 0 (as regen train --log): three rows, not six.
        log = sys.argv[1] + "/dp.csv" if shard == "none" else ""
        loss = m.train(3, log=log)[-1].loss
        out[shard] = (loss, np.concatenate([v.ravel() for v in m.state_dict().values()]))
    same = all(np.array_equal(out["none"][1], out[s][1]) for s in out)
    # Each rank writes its line to a file of its own: mpirun forwards the ranks' standard output in
    # pieces, and two lines printed at once can arrive interleaved.
    line = "rank %d of %d loss %r same %s" % (w["rank"], w["size"], out["none"][0], same)
    with open(sys.argv[1] + "/rank%d.txt" % w["rank"], "w") as f:
        f.write(line + "\\n")
    if len(sys.argv) > 2 and w["rank"] == 1:
        raise RuntimeError("rank 1 stops here")
""")


def mpirun(tmp_path, *args):
    script = tmp_path / "dp.py"
    script.write_text(SCRIPT)
    cmd = [shutil.which("mpiexec"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", "2", sys.executable, str(script), str(tmp_path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ)


needs_mpi = pytest.mark.skipif(not regen.build["mpi"] or shutil.which("mpiexec") is None,
                               reason="regen built without MPI, or no mpiexec")


@needs_mpi
def test_two_ranks_under_mpirun(tmp_path):
    r = mpirun(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(tmp_path.glob("rank*.txt"))
    assert [f.name for f in files] == ["rank0.txt", "rank1.txt"], r.stdout + r.stderr
    lines = [f.read_text().rstrip("\n") for f in files]
    assert lines[0].startswith("rank 0 of 2") and lines[1].startswith("rank 1 of 2")
    # The same global loss on both ranks, and ZeRO-1 and ZeRO-2 bitwise plain's parameters.
    assert lines[0].split("loss")[1] == lines[1].split("loss")[1]
    assert all(line.endswith("same True") for line in lines)
    rows = (tmp_path / "dp.csv").read_text().splitlines()
    assert rows[0].startswith("kind,step,") and [r.split(",")[:2] for r in rows[1:]] == [
        ["train", "1"], ["train", "2"], ["train", "3"]]


@needs_mpi
def test_an_uncaught_exception_on_one_rank_ends_the_job(tmp_path):
    r = mpirun(tmp_path, "fail")
    assert r.returncode != 0
    assert "regen: error: rank 1 of 2: an uncaught Python exception ends the job" in r.stderr
    assert "RuntimeError: rank 1 stops here" in r.stderr


RESUME_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, regen
    d = sys.argv[1]
    w = regen.world()
    kw = dict(batch=2, device="cpu", threads=1, shard="optimizer", bucket_size="16KiB",
              optimizer="adamw")
    whole = regen.Model("transformer-tiny", **kw)
    losses = [r.loss for r in whole.train(4)]
    first = regen.Model("transformer-tiny", **kw)
    first.train(2)
    first.save_state(d + "/state.st")
    resumed = regen.Model("transformer-tiny", **kw)
    resumed.resume(d + "/state.st")
    losses_resumed = [r.loss for r in resumed.train(2)]
    same = losses[2:] == losses_resumed and all(
        np.array_equal(x, y)
        for x, y in zip(whole.state_dict().values(), resumed.state_dict().values()))
    try:
        regen.Model("transformer-tiny", **dict(kw, shard="none")).resume(d + "/state.st")
        refused = "not refused"
    except regen.Error as e:
        refused = str(e)
    with open(d + "/rank%d.txt" % w["rank"], "w") as f:
        f.write("same %s\\n%s\\n" % (same, refused))
""")


@needs_mpi
def test_save_state_and_resume_under_mpirun(tmp_path):
    # A file per rank, written together; a resumed run bitwise the uninterrupted one; another
    # shard mode refused on every rank, naming both (docs/distributed.md, "Training states").
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    cmd = [shutil.which("mpiexec"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", "2", sys.executable, str(script), str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "state.st").exists() and (tmp_path / "state.st.rank1-of-2.a").exists()
    for rank in (0, 1):
        same, refused = (tmp_path / ("rank%d.txt" % rank)).read_text().splitlines()[:2]
        assert same == "same True"
        assert "was saved with shard='optimizer', but this run has shard='none'" in refused
