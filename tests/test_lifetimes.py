"""Lifetimes, races and other processes in the aclnn layer (docs/aclnn.md#threads-processes-and-lifetimes).

Crash-prone cases run in a child process, so that a crash is a failed test rather than
a dead test run.  Each test names the attack it repeats.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from aclnn_iree import aclnn as A
from aclnn_iree.ops import reference as R
from conftest import require_device

SUCCESS = A.ACLNN_SUCCESS


def run_child(code: str, timeout: float = 300) -> str:
    """Runs `code` in a fresh Python process; returns its stdout, failing on a crash, a hang
    or a non-zero exit (with what the child printed)."""
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung for {timeout} s:\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, f"the child exited with {p.returncode}:\n{p.stdout}\n{p.stderr[-4000:]}"
    return p.stdout


# ----------------------------------------------------------------------------- destroyed while queued
_DESTROY_WHILE_QUEUED = """
    import gc, sys
    import numpy as np
    from aclnn_iree.aclnn import *
    from aclnn_iree.ops import reference as R
    op, repeatable, device = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    st, s = aclrtCreateStream(device)
    rng = np.random.default_rng(0)
    if op == "upsample":
        go = rng.standard_normal((2, 16, 256, 256)).astype(np.float32)  # 8 MB: freed memory is unmapped
        want = R.upsample_bilinear2d_backward(go, (256, 256), (2, 16, 128, 128), False)
        ins = [aclCreateTensor(go, format="NCHW", stream=s)]
        outs = [aclCreateTensor(shape=(2, 16, 128, 128), dtype=np.float32, format="NCHW", stream=s)]
        phase1, phase2 = aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize, aclnnUpsampleBilinear2dBackwardV2
        args = (ins[0], aclCreateIntArray([256, 256]), aclCreateIntArray([2, 16, 128, 128]), False, 0.0, 0.0,
                outs[0])
    else:
        x = rng.standard_normal((2, 16, 128, 128)).astype(np.float32)
        g = rng.uniform(-1.1, 1.1, (2, 96, 96, 2)).astype(np.float32)
        go = rng.standard_normal((2, 16, 96, 96)).astype(np.float32)
        want = R.grid_sampler_2d_backward(go, x, g, 0, 2, False)
        ins = [aclCreateTensor(a, stream=s) for a in (go, x, g)]
        outs = [aclCreateTensor(shape=a.shape, dtype=np.float32, stream=s) for a in (x, g)]
        phase1, phase2 = aclnnGridSampler2DBackwardGetWorkspaceSize, aclnnGridSampler2DBackward
        args = (*ins, 0, 2, False, aclCreateBoolArray([True, True]), *outs)
    st, ws, ex = phase1(*args)
    assert st == 0, aclGetRecentErrMsg()
    if repeatable:
        assert aclSetAclOpExecutorRepeatable(ex) == 0
    st, wsb = aclrtMalloc(ws, s) if ws else (0, None)
    # hold the stream at an unsignalled step, so the launch cannot start before the frees
    s.timeline.next_fences()
    assert phase2(wsb, ws, ex, s) == 0, aclGetRecentErrMsg()
    for t in ins:
        assert aclDestroyTensor(t) == 0
    if wsb is not None:
        assert aclrtFree(wsb) == 0
    if repeatable:
        assert aclDestroyAclOpExecutor(ex) == 0
    del ins, wsb, ex, args, go
    gc.collect()
    junk = [np.full(1 << 20, 7.0, np.float32) for _ in range(64)]  # reuses what was freed
    s.timeline.semaphore.signal(1)
    assert aclrtSynchronizeStream(s) == 0, aclGetRecentErrMsg()
    want = want if isinstance(want, tuple) else (want,)
    for t, w in zip(outs, want):  # float32 against the float64 reference, scaled as tests/test_aclnn.py
        np.testing.assert_allclose(t.numpy(), w, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(w).max()))
    print("OK")
"""


@pytest.mark.parametrize("repeatable", [False, True], ids=["single-use", "repeatable"])
@pytest.mark.parametrize("op", ["upsample", "grid_sampler"])
def test_tensors_workspace_and_executor_destroyed_while_queued(op, repeatable, device):
    """The attack: aclDestroyTensor between phase 2 and aclrtSynchronizeStream freed the host
    buffer the queued CPU kernel read (SIGSEGV, or writes into unrelated arrays).  As in CANN,
    destroying a tensor, freeing the workspace or destroying the executor never frees memory
    a launched kernel uses, and the outputs read back right after the sync."""
    code = _DESTROY_WHILE_QUEUED.replace("sys.argv[1], sys.argv[2] == \"1\", sys.argv[3]",
                                         f"{op!r}, {repeatable!r}, {device!r}")
    assert run_child(code).strip().endswith("OK")


def test_output_destroyed_while_queued_does_not_crash(device):
    """An output destroyed while its kernel is queued: the kernel still writes into memory
    that stays alive (the stream holds it), nothing else is overwritten, and the tensor reads
    as destroyed."""
    code = """
        import gc, numpy as np
        from aclnn_iree.aclnn import *
        st, s = aclrtCreateStream(%r)
        go = aclCreateTensor(np.ones((4, 16, 256, 256), np.float32), format="NCHW", stream=s)
        out = aclCreateTensor(shape=(4, 16, 128, 128), dtype=np.float32, format="NCHW", stream=s)
        st, ws, ex = aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
            go, aclCreateIntArray([256, 256]), aclCreateIntArray([4, 16, 128, 128]), False, 0.0, 0.0, out)
        wsb = aclrtMalloc(ws, s)[1] if ws else None
        s.timeline.next_fences()
        assert aclnnUpsampleBilinear2dBackwardV2(wsb, ws, ex, s) == 0
        assert aclDestroyTensor(out) == 0
        gc.collect()
        junk = [np.full(1 << 20, 7.0, np.float32) for _ in range(32)]
        s.timeline.semaphore.signal(1)
        assert aclrtSynchronizeStream(s) == 0
        assert all((j == 7.0).all() for j in junk), "the kernel wrote into unrelated arrays"
        try:
            out.numpy()
        except ValueError as e:
            assert "destroyed" in str(e)
        else:
            raise AssertionError("a destroyed tensor read back")
        print("OK")
    """ % device
    assert run_child(code).strip().endswith("OK")


# ----------------------------------------------------------------------------- executor races
def _small_grid_call(device):
    st, s = A.aclrtCreateStream(device)
    a = lambda *sh: A.aclCreateTensor(np.ones(sh, np.float32), stream=s)  # noqa: E731
    out = lambda *sh: A.aclCreateTensor(shape=sh, dtype=np.float32, stream=s)  # noqa: E731
    tensors = (a(1, 2, 3, 2), a(1, 2, 4, 4), A.aclCreateTensor(np.zeros((1, 3, 2, 2), np.float32), stream=s),
               out(1, 2, 4, 4), out(1, 3, 2, 2))
    return s, tensors


def test_single_use_executor_raced_by_two_threads_runs_once(device):
    """The attack: two threads calling phase 2 on one single-use executor both got SUCCESS in
    23-211 of 300 trials (356 launches for 200 executors).  The check and the release are one
    atomic step now: exactly one SUCCESS and one 561102 per executor, every time."""
    s, (go, x, g, dx, dg) = _small_grid_call(device)
    mask = A.aclCreateBoolArray([True, True])
    trials = 300
    for _ in range(trials):
        st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(go, x, g, 0, 0, False, mask, dx, dg)
        assert st == SUCCESS
        wsb = A.aclrtMalloc(ws, s)[1] if ws else None
        barrier = threading.Barrier(2)
        results = []

        def race():
            barrier.wait()
            results.append(A.aclnnGridSampler2DBackward(wsb, ws, ex, s))

        threads = [threading.Thread(target=race) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(results) == [SUCCESS, A.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR], results
    assert A.aclrtSynchronizeStream(s) == SUCCESS
    assert s.timeline.value == trials  # one launch per executor
    np.testing.assert_allclose(dx.numpy(), R.grid_sampler_2d_backward(
        np.ones((1, 2, 3, 2), np.float32), np.ones((1, 2, 4, 4), np.float32), np.zeros((1, 3, 2, 2), np.float32),
        0, 0, False)[0], rtol=1e-6)


def test_destroy_racing_phase_two_never_crashes(device):
    """aclDestroyAclOpExecutor racing phase 2 of a repeatable executor: each phase 2 either
    ran (SUCCESS) or found it destroyed (561102); never an inner error, never a crash."""
    s, (go, x, g, dx, dg) = _small_grid_call(device)
    mask = A.aclCreateBoolArray([True, True])
    seen = set()
    rng = np.random.default_rng(2)
    for trial in range(100):
        after = int(rng.integers(0, 6))  # destroy once this many launches returned
        st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(go, x, g, 0, 0, False, mask, dx, dg)
        assert A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
        wsb = A.aclrtMalloc(ws, s)[1] if ws else None
        barrier = threading.Barrier(3)
        results = []

        def run():
            barrier.wait()
            for _ in range(5):
                results.append(A.aclnnGridSampler2DBackward(wsb, ws, ex, s))

        def destroy():
            barrier.wait()
            while len(results) < after and any(t.is_alive() for t in threads[:2]):
                pass
            results.append(("destroy", A.aclDestroyAclOpExecutor(ex)))

        threads = [threading.Thread(target=run), threading.Thread(target=run), threading.Thread(target=destroy)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        launches = [r for r in results if not isinstance(r, tuple)]
        assert ("destroy", SUCCESS) in results
        assert set(launches) <= {SUCCESS, A.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR}, results
        seen.update(launches)
    assert A.aclrtSynchronizeStream(s) == SUCCESS
    assert SUCCESS in seen


def test_stream_and_repeatable_executor_shared_by_eight_threads(device):
    """What docs/aclnn.md#threads-processes-and-lifetimes allows: one stream and one repeatable
    executor shared by 8 threads, each launching and synchronizing; every launch succeeds,
    the stream runs them all, and the result is the reference's, bit-identical each time."""
    rng = np.random.default_rng(8)
    xa = rng.standard_normal((2, 8, 16, 16)).astype(np.float32)
    ga = rng.uniform(-1, 1, (2, 12, 12, 2)).astype(np.float32)
    goa = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    st, s = A.aclrtCreateStream(device)
    go, x, g = (A.aclCreateTensor(a, stream=s) for a in (goa, xa, ga))
    dx = A.aclCreateTensor(shape=xa.shape, dtype=np.float32, stream=s)
    dg = A.aclCreateTensor(shape=ga.shape, dtype=np.float32, stream=s)
    st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(go, x, g, 0, 1, False,
                                                              A.aclCreateBoolArray([True, True]), dx, dg)
    assert st == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    wsb = A.aclrtMalloc(ws, s)[1] if ws else None
    per_thread = 50
    statuses = []

    def worker():
        for _ in range(per_thread):
            statuses.append(A.aclnnGridSampler2DBackward(wsb, ws, ex, s))
            statuses.append(A.aclrtSynchronizeStream(s))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert statuses == [SUCCESS] * (16 * per_thread)
    assert s.timeline.value == 8 * per_thread
    assert A.aclrtSynchronizeStream(s) == SUCCESS
    for got, want in zip((dx.numpy(), dg.numpy()), R.grid_sampler_2d_backward(goa, xa, ga, 0, 1, False)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(want).max()))
    first = (dx.numpy(), dg.numpy())
    assert A.aclnnGridSampler2DBackward(wsb, ws, ex, s) == SUCCESS and A.aclrtSynchronizeStream(s) == SUCCESS
    assert (dx.numpy() == first[0]).all() and (dg.numpy() == first[1]).all()
    assert A.aclDestroyAclOpExecutor(ex) == SUCCESS


# ----------------------------------------------------------------------------- fork
def _in_forked_child(q, stream):
    """Runs in a child forked after the parent used `stream`'s device: reports what the
    Pythonic call on that device, and the parent's stream, give."""
    import aclnn_iree
    out = {}
    a = lambda *s: np.ones(s, np.float32)  # noqa: E731
    try:
        dx, _ = aclnn_iree.grid_sampler_2d_backward(a(1, 1, 2, 2), a(1, 1, 3, 3), a(1, 2, 2, 2) * 0,
                                                   device=stream.device.name)
        out["call"] = ("ok", float(dx.sum()))
    except aclnn_iree.AclnnError as e:
        out["call"] = ("error", e.status, str(e))
    out["sync"] = (A.aclrtSynchronizeStream(stream), A.aclGetRecentErrMsg())
    t = A.aclCreateTensor(np.ones(3, np.float32), stream=stream)
    out["tensor"] = (t is None, A.aclGetRecentErrMsg())
    q.put(out)


def _fork_and_report(stream):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_in_forked_child, args=(q, stream))
    p.start()
    p.join(60)
    hung = p.is_alive()
    if hung:
        p.kill()
    assert not hung, "the forked child hung"
    assert p.exitcode == 0
    return q.get(timeout=10)


def test_forked_child_refuses_vulkan_at_once_when_the_parent_used_it():
    """The attack: after the parent used Vulkan, a forked child's first Vulkan call never
    returned from aclrtSynchronizeStream.  The driver does not survive fork() (IREE caches it
    per process): the child now gets 361001 at once, saying to use spawn; the parent's stream
    is refused too."""
    require_device("vulkan")
    st, s = A.aclrtCreateStream("vulkan")
    t = A.aclCreateTensor(np.ones(4, np.float32), stream=s)
    assert t is not None and A.aclrtSynchronizeStream(s) == SUCCESS
    out = _fork_and_report(s)
    kind, status, message = out["call"]
    assert (kind, status) == ("error", A.ACLNN_ERR_RUNTIME_ERROR), out
    assert "forked" in message and "spawn" in message
    assert out["sync"][0] == A.ACLNN_ERR_RUNTIME_ERROR and "parent" in out["sync"][1]
    assert out["tensor"][0] and "parent" in out["tensor"][1]


def test_forked_child_computes_on_the_cpu_but_refuses_the_parents_stream():
    """Local-task forks keep working (a fresh synchronous CPU device in the child); only the
    parent's own stream, whose worker threads are gone, is refused (it used to hang)."""
    st, s = A.aclrtCreateStream("local-task")
    assert A.aclrtSynchronizeStream(s) == SUCCESS
    out = _fork_and_report(s)
    assert out["call"] == ("ok", 4.0), out
    assert out["sync"][0] == A.ACLNN_ERR_RUNTIME_ERROR and "parent" in out["sync"][1]
    assert out["tensor"][0]


def test_spawned_child_uses_vulkan():
    """What the message recommends works: a spawned child computes on Vulkan."""
    require_device("vulkan")
    code = """
        import numpy as np, aclnn_iree
        a = lambda *s: np.ones(s, np.float32)
        dx, _ = aclnn_iree.grid_sampler_2d_backward(a(1, 1, 2, 2), a(1, 1, 3, 3), a(1, 2, 2, 2) * 0, device="vulkan")
        assert float(dx.sum()) == 4.0
        print("OK")
    """
    assert run_child(code).strip().endswith("OK")


@pytest.mark.parametrize("device", ["local-task", "local-sync"])
def test_ctrl_c_at_random_points_never_wedges_the_stream(device):
    """A KeyboardInterrupt raised by a signal handler at a random moment of a call (timer
    signals 10 to 200 us into it, 20,000 calls) leaves the thread's stream usable: each
    later call either finishes or is interrupted in turn, and a call after the storm returns
    the right values.  Before, an interrupt that landed after the stream's timeline moved
    and before the launch reached the queue left a value nothing signals: a later call
    blocked for good within 1-2 k iterations."""
    out = run_child(f"""
        import random, signal, time
        import numpy as np
        from aclnn_iree.core import api
        from aclnn_iree.ops import reference as R
        go = np.random.default_rng(0).standard_normal((1, 2, 8, 8)).astype(np.float32)
        want = R.upsample_bilinear2d_backward(go.astype(np.float64), (8, 8), (1, 2, 4, 4), False)
        def raise_interrupt(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, raise_interrupt)
        rng = random.Random(1)
        interrupted = 0
        api.upsample_bilinear2d_backward(go, (8, 8), (1, 2, 4, 4), device="{device}")  # loaded first
        for i in range(20000):
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 200e-6))
                api.upsample_bilinear2d_backward(go, (8, 8), (1, 2, 4, 4), device="{device}")
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        got = api.upsample_bilinear2d_backward(go, (8, 8), (1, 2, 4, 4), device="{device}")
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
        print("interrupted", interrupted)
    """, timeout=120)  # about 2 s when nothing hangs
    assert int(out.split()[-1]) > 100  # the storm did interrupt calls


def test_a_second_interrupt_while_the_first_is_handled_never_wedges_the_stream():
    """The attack, made deterministic: a first KeyboardInterrupt before the launch reached the
    queue, a second one as the empty submission in its place was being queued.  The step stays
    owed and the stream's next use signals it: the next call and synchronize return."""
    out = run_child("""
        import numpy as np
        from aclnn_iree import aclnn as A
        from aclnn_iree.core import api
        from aclnn_iree.runtime import device as D, kernels as K
        go = np.ones((1, 1, 4, 4), np.float32)
        api.upsample_bilinear2d_backward(go, (4, 4), (1, 1, 2, 2))  # loaded, executor kept
        real_launch, real_fill = K.Kernel.fenced_call, D.Device.fill_call
        def launch_interrupted(self, *a):
            K.Kernel.fenced_call = real_launch
            raise KeyboardInterrupt("first")
        def fill_interrupted(self, *a):
            D.Device.fill_call = real_fill
            raise KeyboardInterrupt("second")
        K.Kernel.fenced_call, D.Device.fill_call = launch_interrupted, fill_interrupted
        try:
            api.upsample_bilinear2d_backward(go, (4, 4), (1, 1, 2, 2))
        except KeyboardInterrupt as e:
            print("interrupted", e, e.__context__)
        owed = [s for s in api._tls.streams.values() if s.timeline._owed]  # (tiny calls run inline: local-sync)
        assert len(owed) == 1 and len(owed[0].timeline._owed) == 1  # the first call's step is owed
        got = api.upsample_bilinear2d_backward(go, (4, 4), (1, 1, 2, 2))
        assert got.sum() == 16.0 and not owed[0].timeline._owed
        assert A.aclrtSynchronizeStream(owed[0]) == 0
        print("ok")
    """, timeout=60)
    assert "interrupted second first" in out and out.strip().endswith("ok"), out


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_a_signal_handlers_call_in_the_middle_of_a_call_is_refused_not_a_hang(device):
    """A signal handler that calls an op on the thread it interrupted, while that thread's own
    call had taken its step of the stream and not yet queued its work, would wait for that call
    forever (it hung: the handler's work waits for the interrupted call's step, which comes only
    after the handler returns).  It is refused with ACLNN_ERR_RUNTIME_ERROR and a message that
    says why; every call that returns computes the right values, and the stream works after."""
    out = run_child(f"""
        import random, signal, time
        import numpy as np
        from aclnn_iree.core import api
        from aclnn_iree.core.errors import AclnnError
        from aclnn_iree.ops import reference as R
        go = np.random.default_rng(0).standard_normal((1, 2, 8, 8)).astype(np.float32)
        want = R.upsample_bilinear2d_backward(go.astype(np.float64), (8, 8), (1, 2, 4, 4), False)
        call = lambda: api.upsample_bilinear2d_backward(go, (8, 8), (1, 2, 4, 4), device="{device}")
        call()
        rng, counts, busy = random.Random(2), dict(ok=0, refused=0, bad=0), [False]

        def check(f):
            try:
                got = f()
            except AclnnError as e:
                assert e.status == 361001 and "signal handler" in str(e), e
                counts["refused"] += 1
                return
            counts["ok" if np.allclose(got, want, rtol=1e-5, atol=1e-6) else "bad"] += 1

        def handler(signum, frame):
            if not busy[0]:
                busy[0] = True
                try:
                    check(call)
                finally:
                    busy[0] = False
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(5e-6, 100e-6))  # the next one
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 50e-6)
        end = time.monotonic() + 2  # (before the fix a run hung within a fraction of a second)
        while time.monotonic() < end:
            check(call)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # first: a handler running now re-arms the timer
        signal.setitimer(signal.ITIMER_REAL, 0)
        check(call)
        assert counts["bad"] == 0, counts
        print("refused", counts["refused"], "ok", counts["ok"])
    """, timeout=120)
    assert int(out.split()[-1]) > 100, out  # calls completed (refusals need a signal at the right bytecode)
