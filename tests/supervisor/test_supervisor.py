"""The supervisor against real processes: start, readiness, logs, exits, stops, orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from yard.config import load_config
from yard.ports import BackendStartError
from yard.supervisor import Supervisor, group_members, looks_like_oom
from yard.testing.backend import backend_command


def backend_toml(name: str, *, extra: str = "", **switches: object) -> str:
    command = backend_command(port="{port}", python="{python}", **switches)
    return (
        f'[backends.{name}]\nmodels = ["{name}-model"]\ncommand = {json.dumps(command)}\n{extra}\n'
    )


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "yard.toml"
    path.write_text(f'[server]\ndata_dir = "data"\nstop_grace_s = 2\n{text}')
    return path


@asynccontextmanager
async def supervising(tmp_path: Path, text: str) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(load_config(write_config(tmp_path, text), env={}))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        yield supervisor
        nursery.cancel_scope.cancel()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_oom_signs_in_log_lines() -> None:
    assert looks_like_oom(["loading", "CUDA error: out of memory"])
    assert looks_like_oom(["terminate called after throwing an instance of 'std::bad_alloc'"])
    assert looks_like_oom(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"])
    assert looks_like_oom(["MemoryError"])
    assert not looks_like_oom(["all good", "memory: 3 GiB used"])


@pytest.mark.slow
async def test_ready_only_after_the_503s_stop_and_logs_are_captured(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, backend_toml("llm", load_time=1.0)) as supervisor:
            process = await supervisor.launch("llm", ())
            async with httpx.AsyncClient(base_url=process.base_url, trust_env=False) as client:
                while True:  # wait until it listens, to see it say "loading"
                    try:
                        early = await client.get("/health")
                        break
                    except httpx.ConnectError:
                        await trio.sleep(0.02)
                assert early.status_code == 503
                await process.wait_ready()
                assert trio.current_time() - process.started_at >= 1.0
                assert (await client.get("/health")).status_code == 200
                models = await client.get("/v1/models")
                assert models.json()["data"][0]["id"] == "test-model"
            ring = supervisor.log_lines("llm")
            assert ring[0].startswith("[yard] starting llm on port")
            assert any(line.startswith("listening on http://127.0.0.1:") for line in ring)
            assert "ready" in ring
            log_file = tmp_path / "data" / "logs" / "llm.log"
            assert "ready\n" in log_file.read_text()
            pid_file = json.loads((tmp_path / "data" / "run" / "llm.pid").read_text())
            assert pid_file["pid"] == pid_file["pgid"] == process.pid
            assert process.pid is not None
            assert os.getpgid(process.pid) == process.pid  # a group of its own
            status = await process.stop()
            assert status.code == -signal.SIGTERM
            assert not status.oom
            assert not (tmp_path / "data" / "run" / "llm.pid").exists()


@pytest.mark.slow
async def test_placeholders_and_cuda_visible_devices_reach_the_process(tmp_path: Path) -> None:
    script = (
        "import os, sys; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES']); "
        "print('EXTRA=' + os.environ['EXTRA']); print('ARGS=' + ' '.join(sys.argv[1:]))"
    )
    text = f"""
    [backends.probe]
    models = ["m"]
    command = ["{{python}}", "-c", "{script}", "{{port}}", "{{host}}", "{{model}}", "{{gpus}}"]
    env = {{ EXTRA = "{{data_dir}}" }}
    gpus = ["gpu1", "gpu3"]
    """
    with trio.fail_after(30):
        async with supervising(tmp_path, textwrap.dedent(text)) as supervisor:
            process = await supervisor.launch("probe", ("gpu3",))
            status = await process.wait_exit()
            assert status.code == 0
            lines = supervisor.log_lines("probe")
            assert "CVD=3" in lines
            assert f"EXTRA={tmp_path / 'data'}" in lines
            assert f"ARGS={process.port} 127.0.0.1 m 3" in lines
            with pytest.raises(BackendStartError, match="exited before it was ready"):
                await process.wait_ready()


@pytest.mark.slow
async def test_crash_is_seen_at_once_with_its_exit_code(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, backend_toml("llm", crash_after=0)) as supervisor:
            process = await supervisor.launch("llm", ())
            await process.wait_ready()
            async with httpx.AsyncClient(base_url=process.base_url, trust_env=False) as client:
                with pytest.raises(httpx.RemoteProtocolError):
                    await client.post("/v1/completions", json={"prompt": "x"})
            t0 = trio.current_time()
            status = await process.wait_exit()
            assert trio.current_time() - t0 < 2.0  # no polling interval to wait out
            assert status.code == 3
            assert not status.oom
            assert "llm exited with code 3" in status.detail
            assert "crashing on purpose" in status.detail
            assert supervisor.statistics().exits == 1


@pytest.mark.slow
async def test_out_of_memory_at_load_fails_the_start_with_the_oom_sign(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, backend_toml("llm", oom=True, load_time=0.2)) as sup:
            process = await sup.launch("llm", ())
            with pytest.raises(BackendStartError) as info:
                await process.wait_ready()
            assert info.value.oom
            assert "CUDA error: out of memory" in info.value.detail
            assert sup.statistics().oom_exits == 1


@pytest.mark.slow
async def test_a_sigkill_yard_did_not_send_counts_as_out_of_memory(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, backend_toml("llm")) as supervisor:
            process = await supervisor.launch("llm", ())
            await process.wait_ready()
            assert process.pid is not None
            os.kill(process.pid, signal.SIGKILL)  # as the kernel's OOM killer would
            status = await process.wait_exit()
            assert status.code == -signal.SIGKILL
            assert status.oom
            assert "out-of-memory killer" in status.detail


@pytest.mark.slow
async def test_stop_escalates_to_sigkill_and_the_whole_group_dies(tmp_path: Path) -> None:
    text = backend_toml("stubborn", ignore_sigterm=True, child=True, extra="stop_grace_s = 0.5")
    with trio.fail_after(30):
        async with supervising(tmp_path, text) as supervisor:
            process = await supervisor.launch("stubborn", ())
            await process.wait_ready()
            child = next(
                int(line.split()[-1])
                for line in supervisor.log_lines("stubborn")
                if line.startswith("child pid ")
            )
            assert process.pid is not None
            assert os.getpgid(child) == process.pid
            t0 = trio.current_time()
            status = await process.stop()
            elapsed = trio.current_time() - t0
            assert 0.5 <= elapsed < 3
            assert status.code == -signal.SIGKILL
            assert not status.oom  # yard sent that SIGKILL itself
            assert gone(process.pid) and gone(child)
            assert group_members(process.pid) == []
            assert "SIGKILL to group" in supervisor.log_lines("stubborn")[-2]


@pytest.mark.slow
async def test_a_child_left_behind_by_a_crashed_leader_is_killed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, backend_toml("llm", child=True)) as supervisor:
            process = await supervisor.launch("llm", ())
            await process.wait_ready()
            assert process.pid is not None
            os.kill(process.pid, signal.SIGKILL)
            await process.wait_exit()
            assert group_members(process.pid) == []


@pytest.mark.slow
async def test_a_backend_that_never_gets_healthy_is_stopped_by_sigterm(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, backend_toml("llm", fail_health=True)) as supervisor:
            process = await supervisor.launch("llm", ())
            with trio.move_on_after(1.0) as waited:
                await process.wait_ready()
            assert waited.cancelled_caught  # the caller's start-up timeout ends it
            assert not process.ready
            status = await process.stop()
            assert status.code == -signal.SIGTERM
            assert "after yard asked it to stop" in status.detail
            with pytest.raises(BackendStartError):
                await process.wait_ready()


@pytest.mark.slow
async def test_launch_of_a_missing_program_fails_at_once(tmp_path: Path) -> None:
    text = '[backends.ghost]\nmodels = ["g"]\ncommand = ["/nonexistent/server", "{port}"]\n'
    with trio.fail_after(10):
        async with supervising(tmp_path, text) as supervisor:
            with pytest.raises(BackendStartError, match="cannot start ghost: /nonexistent/server"):
                await supervisor.launch("ghost", ())
            with pytest.raises(BackendStartError, match="no backend called 'nope'"):
                await supervisor.launch("nope", ())


@pytest.mark.slow
async def test_warm_up_runs_before_ready(tmp_path: Path) -> None:
    counter = tmp_path / "served"
    warm = '[backends.llm.warmup]\npath = "/v1/completions"\njson = { prompt = "long" }\n'
    crashing = '[backends.bad.warmup]\npath = "/v1/completions"\n'
    text = backend_toml("llm", counter_file=counter, extra=warm) + backend_toml(
        "bad", crash_after=0, extra=crashing
    )
    with trio.fail_after(30):
        async with supervising(tmp_path, text) as supervisor:
            process = await supervisor.launch("llm", ())
            await process.wait_ready()
            assert counter.read_text().splitlines() == ["req-1"]
            bad = await supervisor.launch("bad", ())
            with pytest.raises(BackendStartError, match="exited before it was ready"):
                await bad.wait_ready()


KILLED_YARD = """
import sys, trio
from pathlib import Path
from yard.config import load_config
from yard.supervisor import Supervisor

async def main():
    supervisor = Supervisor(load_config(Path(sys.argv[1]), env={}))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        process = await supervisor.launch("llm", ())
        await process.wait_ready()
        print("READY", process.pid, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


@pytest.mark.slow
async def test_a_new_yard_reaps_the_backends_a_killed_yard_left(tmp_path: Path) -> None:
    path = write_config(tmp_path, backend_toml("llm", child=True))
    with trio.fail_after(60):
        yard = await trio.lowlevel.open_process(
            [sys.executable, "-c", KILLED_YARD, str(path)], stdout=subprocess.PIPE
        )
        try:
            assert yard.stdout is not None
            output = b""
            while b"\n" not in output:
                output += await yard.stdout.receive_some(1024)
            backend_pid = int(output.split()[1])
        finally:
            yard.kill()  # SIGKILL: no clean-up of any kind
            await yard.wait()
        child = psutil.Process(backend_pid).children()[0].pid
        assert not gone(backend_pid) and not gone(child)  # left running

        # A process sharing the data directory that does not own its
        # backends (yard probe) opts out of reaping.
        bystander = Supervisor(load_config(path, env={}), reap_orphans=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(bystander.run)
            nursery.cancel_scope.cancel()
        assert not gone(backend_pid) and not gone(child)
        assert (tmp_path / "data" / "run" / "llm.pid").exists()

        supervisor = Supervisor(load_config(path, env={}))
        orphans = await supervisor.reap_orphans()
        assert [(o.backend, o.pid, o.killed) for o in orphans] == [("llm", backend_pid, True)]
        assert gone(backend_pid) and gone(child)
        assert group_members(backend_pid) == []
        assert not (tmp_path / "data" / "run" / "llm.pid").exists()
        assert "left running by an earlier yard" in supervisor.log_lines("llm")[0]


@pytest.mark.slow
async def test_reaping_finds_a_group_whose_leader_died_too(tmp_path: Path) -> None:
    path = write_config(tmp_path, backend_toml("llm", child=True))
    with trio.fail_after(60):
        yard = await trio.lowlevel.open_process(
            [sys.executable, "-c", KILLED_YARD, str(path)], stdout=subprocess.PIPE
        )
        try:
            assert yard.stdout is not None
            output = b""
            while b"\n" not in output:
                output += await yard.stdout.receive_some(1024)
            backend_pid = int(output.split()[1])
        finally:
            yard.kill()
            await yard.wait()
        child = psutil.Process(backend_pid).children()[0].pid
        os.kill(backend_pid, signal.SIGKILL)  # the leader dies; its child lives on
        await trio.sleep(0.2)  # for init to reap it (where PID 1 reaps at all)
        assert not gone(child)
        orphans = await Supervisor(load_config(path, env={})).reap_orphans()
        assert [o.killed for o in orphans] == [True]
        assert gone(child)


@pytest.mark.slow
async def test_reaping_never_kills_a_process_that_reused_the_pid(tmp_path: Path) -> None:
    path = write_config(tmp_path, backend_toml("llm"))
    stranger = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        run_dir = tmp_path / "data" / "run"
        run_dir.mkdir(parents=True)
        started = psutil.Process(stranger.pid).create_time()
        (run_dir / "llm.pid").write_text(
            json.dumps(
                {"backend": "llm", "pid": stranger.pid, "pgid": stranger.pid,
                 "start_time": started - 100.0}
            )
        )  # fmt: skip
        with trio.fail_after(10):
            orphans = await Supervisor(load_config(path, env={})).reap_orphans()
        assert [(o.pid, o.killed) for o in orphans] == [(stranger.pid, False)]
        assert stranger.poll() is None
        assert not (run_dir / "llm.pid").exists()
    finally:
        stranger.kill()
        await stranger.wait()


@pytest.mark.slow
async def test_cancelling_the_supervisor_stops_every_backend(tmp_path: Path) -> None:
    text = backend_toml("a") + backend_toml("b")
    with trio.fail_after(30):
        async with supervising(tmp_path, text) as supervisor:
            a = await supervisor.launch("a", ())
            b = await supervisor.launch("b", ())
            await a.wait_ready()
            await b.wait_ready()
            pids = [a.pid, b.pid]
            assert sorted(supervisor.running()) == ["a", "b"]
        assert all(pid is not None and gone(pid) for pid in pids)
        assert list((tmp_path / "data" / "run").glob("*.pid")) == []


@pytest.mark.slow
async def test_backends_of_another_running_yard_are_not_orphans(tmp_path: Path) -> None:
    path = write_config(tmp_path, backend_toml("llm"))
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    other_yard = await trio.lowlevel.open_process(sleep)
    its_backend = await trio.lowlevel.open_process(sleep, start_new_session=True)
    try:
        run_dir = tmp_path / "data" / "run"
        run_dir.mkdir(parents=True)
        pid_file = run_dir / "llm.pid"
        pid_file.write_text(
            json.dumps(
                {
                    "backend": "llm",
                    "pid": its_backend.pid,
                    "pgid": its_backend.pid,
                    "start_time": psutil.Process(its_backend.pid).create_time(),
                    "yard_pid": other_yard.pid,
                    "yard_start_time": psutil.Process(other_yard.pid).create_time(),
                }
            )
        )
        supervisor = Supervisor(load_config(path, env={}))
        with trio.fail_after(10):
            assert await supervisor.reap_orphans() == []
        assert its_backend.poll() is None
        assert pid_file.exists()
        # Once that yard is gone (killed), its backend is an orphan.
        other_yard.kill()
        await other_yard.wait()
        with trio.fail_after(10):
            orphans = await supervisor.reap_orphans()
        assert [(o.pid, o.killed) for o in orphans] == [(its_backend.pid, True)]
        assert await its_backend.wait() == -signal.SIGKILL
    finally:
        for process in (other_yard, its_backend):
            process.kill()
            await process.wait()
