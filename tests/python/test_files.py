# Files from Python: no write replaces a file that something reads or that holds another output
# (core/io.h check_distinct_files, which the command line's --save, --log, --out use too), through
# relative paths, symbolic and hard links; a refused write leaves every file as it was and runs no
# step. A training state saved before the first step resumes. Arguments the command line checks
# (counts, planning keywords that would be ignored) are refused before anything runs.
import os
import re

import numpy as np
import pytest

import regen

TEXT = dict(name="transformer-tiny", batch=2, device="cpu", vocab=256, seq_len=16)
SMALL = dict(name="resnet-tiny", batch=2, device="cpu", image_size=32)


def write_text(path):
    path.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    return path.read_bytes()


def leftovers(folder):
    """Temporaries a failed atomic write would have left (AtomicFileWriter's path.tmp.PID.N)."""
    return [n for n in os.listdir(folder) if ".tmp." in n]


def test_no_write_replaces_the_training_text(tmp_path, monkeypatch):
    d = tmp_path / "d.txt"
    before = write_text(d)
    m = regen.Model(**TEXT, data=f"text:{d}")
    e = re.escape(str(d))
    same = rf"'{e}' is the same file as data='text:{e}': give each output its own path"
    with pytest.raises(regen.Error, match=rf"^save_state\('{e}'\): {same}"):
        m.save_state(str(d))
    with pytest.raises(regen.Error, match=rf"^save\('{e}'\): {same}"):
        m.save(str(d))
    with pytest.raises(regen.Error, match=rf"^train\(log='{e}'\): {same}"):
        m.train(1, log=str(d))
    # Through a relative path, a symbolic link and a hard link.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(regen.Error, match=r"^save_state\('d.txt'\): 'd.txt' is the same file as "
                                          r"data='text:"):
        m.save_state("d.txt")
    os.symlink(d, tmp_path / "link.txt")
    with pytest.raises(regen.Error, match=r"^save\('link.txt'\): 'link.txt' is the same file"):
        m.save("link.txt")
    os.link(d, tmp_path / "hard.txt")
    with pytest.raises(regen.Error, match=r"^train\(log='hard.txt'\): 'hard.txt' is the same file"):
        m.train(1, log="hard.txt")
    # Module functions too, while a Model reads the file.
    with pytest.raises(regen.Error, match=r"^save_safetensors\('d.txt'\): 'd.txt' is the same file "
                                          r"as data='text:.*' of a live Model\('transformer-tiny'\)"):
        regen.save_safetensors("d.txt", {"a": np.ones(2, dtype=np.float32)})
    other = regen.Model(**TEXT)
    with pytest.raises(regen.Error, match=r"of another live Model\('transformer-tiny'\)"):
        other.save("d.txt")
    assert d.read_bytes() == before and m.steps_done == 0 and leftovers(tmp_path) == []
    # Once no Model reads it, it is a file like any other.
    del m
    regen.save_safetensors("d.txt", {"a": np.ones(2, dtype=np.float32)})


def test_a_log_is_never_replaced_by_a_checkpoint(tmp_path):
    m = regen.Model(**SMALL)
    log = tmp_path / "m.csv"
    m.train(1, log=str(log))
    kept = log.read_bytes()
    with pytest.raises(regen.Error, match=r"^save_state\('.*m.csv'\): '.*m.csv' is the same file "
                                          r"as train\(log='.*m.csv'\)"):
        m.save_state(str(log))
    with pytest.raises(regen.Error, match=r"^save\('.*m.csv'\): .* is the same file as train\(log="):
        m.save(str(log))
    assert log.read_bytes() == kept
    m.train(1, log=str(log))  # the log itself is appended to
    assert log.read_text().count("\n") == 3  # header and two steps
    # Nor a checkpoint by a log, or a training state by a checkpoint.
    ckpt, state = tmp_path / "c.safetensors", tmp_path / "s.safetensors"
    m.save(str(ckpt))
    with pytest.raises(regen.Error, match=r"^train\(log='.*c.safetensors'\): .* is the same file as "
                                          r"save\('.*c.safetensors'\)"):
        m.train(1, log=str(ckpt))
    m.save_state(str(state))
    with pytest.raises(regen.Error, match=r"is the same file as save_state\("):
        m.save(str(state))
    assert regen.load_safetensors(str(ckpt))[1]["format"] == "regen-checkpoint-1"
    assert regen.load_safetensors(str(state))[1]["format"] == "regen-training-state-1"
    assert m.steps_done == 2


def test_in_place_as_the_command_line_allows(tmp_path):
    # --save may name the --load file and --save-state the --resume file: each is read whole
    # first and replaced atomically. A state is not replaced by weights alone, nor a read file by a
    # log.
    ckpt, state = str(tmp_path / "c.safetensors"), str(tmp_path / "s.safetensors")
    first = regen.Model(**SMALL)
    first.train(1)
    first.save(ckpt)
    first.save_state(state)
    del first
    m = regen.Model(**SMALL)
    m.load(ckpt)
    m.train(1)
    m.save(ckpt)
    with pytest.raises(regen.Error, match=r"^train\(log='.*c.safetensors'\): .* is the same file as "
                                          r"load\('.*c.safetensors'\)"):
        m.train(1, log=ckpt)
    r = regen.Model(**SMALL)
    r.resume(state)
    r.train(1)
    r.save_state(state)
    with pytest.raises(regen.Error, match=r"^save\('.*s.safetensors'\): .* is the same file as "
                                          r"resume\('.*s.safetensors'\)"):
        r.save(state)
    assert regen.load_safetensors(state)[1]["optimizer_steps"] == "2"


def test_plans_and_profiles_keep_their_files(tmp_path):
    m = regen.Model(**SMALL)
    pfile, qfile = str(tmp_path / "p.json"), str(tmp_path / "q.json")
    m.profile(iterations=1).save(pfile)
    p = regen.load_profile(pfile)
    p.save(pfile)  # over its own file: the same profile again
    plan = regen.plan(p, "blocks")
    before = open(pfile).read()
    with pytest.raises(regen.Error, match=r"^Plan.save\('.*p.json'\): '.*p.json' is the same file "
                                          r"as load_profile\('.*p.json'\) \(the plan's profile\)"):
        plan.save(pfile)
    assert open(pfile).read() == before
    plan.save(qfile)
    q = regen.load_plan(qfile, p)
    q.save(qfile)
    m.use_plan(q)
    # The Model now plans with both files: neither is a place for its outputs.
    with pytest.raises(regen.Error, match=r"^save\('.*p.json'\): .* is the same file as "
                                          r"load_profile\('.*p.json'\)"):
        m.save(pfile)
    with pytest.raises(regen.Error, match=r"^train\(log='.*q.json'\): .* is the same file as "
                                          r"load_plan\('.*q.json'\)"):
        m.train(1, log=qfile)
    assert open(pfile).read() == before and leftovers(tmp_path) == []


def test_a_state_saved_before_the_first_step_resumes(tmp_path):
    state = str(tmp_path / "s0.safetensors")
    opts = dict(SMALL, optimizer="adamw", lr=0.01)
    m = regen.Model(**opts)
    m.save_state(state)
    assert regen.load_safetensors(state)[1]["optimizer_steps"] == "0"
    r = regen.Model(**opts)
    meta = r.resume(state)
    assert meta["optimizer_steps"] == "0" and r.optimizer_steps == 0
    m.train(2)
    r.train(2)
    fresh = regen.Model(**opts)
    fresh.train(2)
    a, b, c = m.state_dict(), r.state_dict(), fresh.state_dict()
    for k in a:
        assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]), k


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    keep = tmp_path / "t.safetensors"
    regen.save_safetensors(str(keep), {"a": np.ones(2, dtype=np.float32)})
    before = keep.read_bytes()
    # A tensor that cannot be written after one that can: nothing reaches the file.
    with pytest.raises(regen.Error, match="complex"):
        regen.save_safetensors(str(keep), {"a": np.zeros(3, dtype=np.float32),
                                           "b": np.zeros(2, dtype=np.complex64)})
    m = regen.Model(**SMALL)
    with pytest.raises(regen.Error, match="is a directory"):
        m.save_state(str(tmp_path))
    # A log written row by row keeps whole rows when training stops with an exception.
    log = tmp_path / "m.jsonl"

    def stop(step, result):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        m.train(3, log=str(log), progress=stop)
    assert keep.read_bytes() == before and leftovers(tmp_path) == []
    assert [line.endswith("}") for line in log.read_text().splitlines()] == [True, True]


@pytest.mark.parametrize("call,match", [
    (lambda m: m.train(0), r"^train: steps=0: must be a positive integer$"),
    (lambda m: m.train(2**70), r"^train: steps=1180591620717411303424: must be at most"),
    (lambda m: m.train(True), r"^train: steps=True: must be an integer \(got a bool\)"),
    (lambda m: m.train(0, policy="blocks"), r"^train: steps=0"),
    (lambda m: m.train(2, policy="blocks", profile_steps=0),
     r"^train: profile_steps=0: must be a positive integer$"),
    (lambda m: m.train(2, policy="blocks", profile_steps=2**31),
     r"^train: profile_steps=2147483648: must be at most 2147483647$"),
    (lambda m: m.profile(iterations=0), r"^profile: iterations=0: must be a positive integer$"),
    (lambda m: m.profile(iterations=2**40), r"^profile: iterations=1099511627776: must be at most"),
    (lambda m: m.profile(warmup=-1), r"^profile: warmup=-1: must be a non-negative integer$"),
    (lambda m: regen.profile(m, iterations=0), r"^profile: iterations=0"),
    (lambda m: m.train(1, layout="planned"),
     r"^train: layout='planned' places the blocks of a rematerialization plan: give policy="),
    (lambda m: m.train(1, policy="none", layout="planned"), r"^train: layout='planned' places"),
    (lambda m: m.train(2, policy="dtr", budget="90%", layout="planned"),
     r"^train: layout='planned': policy='dtr' evicts at run time"),
    (lambda m: m.train(1, offload="activations"),
     r"^train: offload='activations' applies to planning with a policy: give policy="),
    (lambda m: m.train(1, chain="drop"), r"^train: chain='drop' applies to planning"),
    (lambda m: m.train(1, budget_of="allocated"), r"^train: budget_of='allocated' applies to"),
    (lambda m: m.train(1, transfer="gbps:10"), r"^train: transfer='gbps:10' applies to"),
    (lambda m: m.train(1, policy="none", offload="all"), r"^train: offload='all' applies to"),
    (lambda m: m.train(3, policy="blocks", offload="activations"),
     r"^train: offload='activations' is what a planner may move to the host tier, but "
     r"policy='blocks' plans no offload and would ignore it: give policy='dp' or policy='milp'"),
    (lambda m: m.train(2, policy="dp", offload="all", transfer="t.json", log="./t.json"),
     r"^train\(log='./t.json'\): './t.json' is the same file as transfer='t.json'"),
    (lambda m: m.train(1, budget="50%"), r"^train: budget='50%' needs a policy="),
    (lambda m: m.train(1, policy="none", budget="80%"),
     r"^train: budget='80%' needs a policy= \(a rematerialization planner: blocks, .*\); "
     r"policy='none' plans nothing$"),
    (lambda m: m.train(1, policy="bloks"), r"^train: unknown policy 'bloks': known policies are"),
    (lambda m: m.train(1, policy="dp", budget="60 percent"), r"^budget='60 percent': "),
    (lambda m: m.train(1, policy="dp", budget="60%", chain="both"), r"^train: .*'both'"),
    (lambda m: m.train(1, policy="dp", offload="disk"), r"^train: offload='disk'"),
    (lambda m: m.set_limit(-1), r"^set_limit: limit=-1: must be a non-negative integer$"),
    (lambda m: m.set_limit(2**70), r"^set_limit: limit=1180591620717411303424: must be at most"),
    (lambda m: m.set_limit(1000), r"^set_limit: the limit replaces a plan's, and the Model has no "
                                  r"plan: its steps run under no limit"),
])
def test_arguments_the_command_line_checks(tmp_path, monkeypatch, call, match):
    monkeypatch.chdir(tmp_path)
    m = regen.Model(**SMALL)
    with pytest.raises(regen.Error, match=match):
        call(m)
    assert m.steps_done == 0 and os.listdir(tmp_path) == []


def test_a_plan_carries_its_own_planning_arguments():
    m = regen.Model(**SMALL)
    p = m.profile(iterations=1)
    plan = regen.plan(p, "blocks")
    done = m.steps_done
    with pytest.raises(regen.Error, match=r"^train: budget='50%' applies to planning with policy=; "
                                          r"plan= carries its own budget"):
        m.train(1, plan=plan, budget="50%")
    with pytest.raises(regen.Error, match=r"^train: layout='planned' contradicts plan="):
        m.train(1, plan=plan, layout="planned")
    with pytest.raises(regen.Error, match=r"^train: offload='activations' applies to planning with "
                                          r"a policy; plan= carries its own"):
        m.train(1, plan=plan, offload="activations")
    assert m.steps_done == done
    m.train(1, plan=plan)


@pytest.mark.parametrize("call,match", [
    (lambda: regen.measure_transfer(repeats=0),
     r"^measure_transfer: repeats=0: must be a positive integer$"),
    (lambda: regen.measure_transfer(repeats=10**6),
     r"^measure_transfer: repeats=1000000: must be at most 1000$"),
    (lambda: regen.measure_transfer(sizes=[]), r"^measure_transfer: sizes is empty"),
    (lambda: regen.measure_transfer(sizes=[0]), r"^measure_transfer: sizes=0: must be a positive integer$"),
    (lambda: regen.measure_transfer(sizes=["2TiB"]), r"must be between 1 byte and 1 TiB"),
    (lambda: regen.estimate("resnet-tiny", 0), r"^batch=0: must be a positive integer$"),
    (lambda: regen.estimate("resnet-tiny", 2**70), r"^batch=1180591620717411303424: must be at"),
])
def test_module_arguments_the_command_line_checks(call, match):
    with pytest.raises(regen.Error, match=match):
        call()


def test_milp_time_limit_in_the_command_lines_range():
    p = regen.Model(**SMALL).profile(iterations=1)
    d = [False] * p.num_saved
    with pytest.raises(regen.Error, match=r"^simulate: limit=1180591620717411303424: must be at "
                                          r"most"):
        regen.simulate(p, d, limit=2**70)
    with pytest.raises(regen.Error, match=r"^simulate_dtr: top_live=2147483648: must be at most "
                                          r"2147483647$"):
        regen.simulate_dtr(p, top_live=2**31)
    with pytest.raises(regen.Error, match=r"^plan: milp_threads=0: must be a positive integer$"):
        regen.plan(p, "dp", "80%", milp_threads=0)
    with pytest.raises(regen.Error, match=r"^plan: milp_threads=1000000: must be at most 1024$"):
        regen.plan(p, "milp", "100%", milp_threads=10**6)
    with pytest.raises(regen.Error, match=r"^plan: milp_time_limit=0.01: must be a number of "
                                          r"seconds from 0.1 to 86400$"):
        regen.plan(p, "milp", "80%", milp_time_limit=0.01)


def test_a_refused_train_leaves_its_log_as_it_was(tmp_path):
    plan = regen.plan(regen.Model(**SMALL).profile(iterations=1), "dp", "1%",
                      budget_of="allocated")
    log = tmp_path / "old.csv"
    log.write_text("kind,step\n")
    m = regen.Model(**SMALL)  # no step yet: its log would be started afresh
    with pytest.raises(regen.Error, match="does not fit its budget"):
        m.train(1, plan=plan, log=str(log))
    assert log.read_text() == "kind,step\n" and m.steps_done == 0


def test_progress_may_save_but_not_change_the_step_under_way(tmp_path):
    # The loop checked its plan before the first step: a plan installed from the progress callback
    # (one that does not fit, say) would run unchecked. Saving a state there is what it is for.
    m = regen.Model(**SMALL)
    m.profile(iterations=1)
    m.plan("blocks")
    done = m.steps_done
    state = str(tmp_path / "every.safetensors")

    def save(step, result):
        m.save_state(state)

    m.train(2, progress=save)
    assert regen.load_safetensors(state)[1]["optimizer_steps"] == str(done + 2)
    for name, call in [("plan", lambda: m.plan("blocks", "70%", budget_of="allocated")),
                       ("train", lambda: m.train(1)), ("clear_plan", m.clear_plan),
                       ("profile", lambda: m.profile(iterations=1)), ("set_limit",
                                                                        lambda: m.set_limit(0)),
                       ("resume", lambda: m.resume(state))]:
        def progress(step, result):
            call()

        with pytest.raises(regen.Error, match=rf"^{name}: the Model is training \(this is a call "
                                              r"from train\(\)'s progress callback\)"):
            m.train(2, progress=progress)
    assert m.steps_done == done + 2 + 6  # each refused after the first of its two steps
    assert m.train(1)[0].exact


def test_a_log_that_cannot_be_written_is_refused_before_the_first_step(tmp_path):
    # As regen train checks --log: a FIFO with no reader would block the open for ever.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    m = regen.Model(**SMALL)
    with pytest.raises(regen.Error, match=r"^train\(log='.*fifo'\): cannot write there: .* is a "
                                          r"FIFO; regen writes only regular files"):
        m.train(2, log=str(fifo))
    with pytest.raises(regen.Error, match=r"^train\(log='.*no_such_dir/m.csv'\): cannot write "
                                          r"there: folder .* does not exist"):
        m.train(2, log=str(tmp_path / "no_such_dir" / "m.csv"))
    with pytest.raises(regen.Error, match=r"^train\(log='.*/'\): cannot write there: .* names a "
                                          r"folder"):
        m.train(2, log=str(tmp_path) + "/")
    assert m.steps_done == 0


def test_the_log_keeps_the_profiling_steps(tmp_path):
    # train(policy=) profiles first, and those steps train: the log has them, as regen train's.
    m = regen.Model(**SMALL)
    log = tmp_path / "m.csv"
    m.train(2, policy="blocks", profile_steps=2, log=str(log))
    rows = log.read_text().splitlines()
    assert [r.split(",")[:2] for r in rows[1:]] == [["train", str(i)] for i in range(1, 5)]
    assert m.optimizer_steps == 4


def test_a_log_named_in_capitals_is_csv(tmp_path):
    # The extension in any case says CSV, as --log reads it (models/metrics_log.cpp).
    m = regen.Model(**SMALL)
    log = tmp_path / "m.CSV"
    m.train(2, log=str(log))
    rows = log.read_text().splitlines()
    assert rows[0].startswith("kind,step,loss,") and len(rows) == 3
