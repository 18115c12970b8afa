"""scripts/train.sbatch against a real Slurm that the test starts itself (root only; `nox -s slurm`).

A one-host cluster: munged, slurmctld and slurmd with a slurm.conf of this machine's CPUs, in a
temporary folder, stopped afterwards. Debian's slurm-wlm runs one slurmd per host here, so the job is
one node with two tasks (two ranks over gloo). Marked `slurm`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trained import assert_bitwise_equal, train_on_one_machine

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]  # one worker: the cluster's daemons use fixed ports

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel")
SETTINGS = ("--device", "cpu", "--backend", "gloo", "--precision", "no", "--parallelism", "ddp", "--seed", "5",
            "--samples", "512", "--global-batch-size", "32", "--no-progress",
            # 40 epochs, about 3 s: USR1 travels through slurmctld and slurmd, and 6 epochs (0.5 s) could end before
            # it arrived after the first checkpoint.
            "--epochs", "40")  # fmt: skip


def slurm_conf(folder: Path) -> str:
    """sched_interval=1: a requeued job becomes startable once its old credentials expire (cred_expire=10), and
    only the main scheduling loop starts it then, every 60 s by default, which the requeue tests would wait for."""
    host = socket.gethostname()
    return f"""ClusterName=ddptest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldPort=6917
SlurmdPort=6918
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
SchedulerParameters=sched_interval=1
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.log
MpiDefault=none
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="session")  # session: xdist interleaves modules
def cluster(tmp_path_factory):
    """A one-host Slurm cluster, started here and stopped afterwards; yields the environment for its commands."""
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or missing:
        pytest.skip(f"needs Linux, root and Debian's slurm-wlm (missing: {', '.join(missing) or 'root'})")
    folder = tmp_path_factory.mktemp("slurm")
    for name in ("state", "spool"):
        (folder / name).mkdir()
    (folder / "slurm.conf").write_text(slurm_conf(folder), encoding="utf-8")
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    started_munge = subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0
    if started_munge:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "munged"], check=True)
    subprocess.run(["slurmctld"], env=env, check=True)
    subprocess.run(["slurmd"], env=env, check=True)
    try:
        deadline = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, (folder / "slurmctld.log").read_text(encoding="utf-8")[-3000:]
            time.sleep(0.5)
        yield env, folder
    finally:
        for daemon in ("slurmd", "slurmctld"):
            pid_file = folder / f"{daemon}.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError):  # it stopped already
                    os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        if started_munge:
            subprocess.run(["pkill", "-x", "munged"])


@pytest.fixture(scope="session")  # session: xdist interleaves modules
def project(rendered):
    return rendered("linux-torchrun")


def job_env(cluster, project: Path) -> dict:
    return {
        **cluster[0],
        "PYTHONPATH": str(project / "src"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }


def job_state(env: dict, job: str) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S+)", shown))


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def submit(env: dict, project: Path, *args: str) -> str:
    """sbatch scripts/train.sbatch ARGS; the job id."""
    submitted = subprocess.run(["sbatch", "--parsable", "scripts/train.sbatch", *args],
                               cwd=project, env=env, capture_output=True, text=True)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def wait_for(env: dict, job: str, timeout_s: float = 480) -> dict[str, str]:
    """The job's final state. Polled here every 0.2 s: `sbatch --wait` polls ever more slowly, up to 10 s apart."""
    deadline = time.monotonic() + timeout_s
    while (state := job_state(env, job)).get("JobState") not in FINISHED:
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    return state


def completions(cluster) -> list[str]:
    """What Slurm's job completion log (read by `sacct --completion`) says of each job."""
    done = subprocess.run(["sacct", "--completion", "-n", "-P", "-o", "JobID,State,ExitCode,Elapsed"],
                          env=cluster[0], capture_output=True, text=True)  # fmt: skip
    return done.stdout.split()


@pytest.fixture(scope="session")  # session: xdist interleaves modules
def spawn_reference(project, tmp_path_factory) -> Path:
    return train_on_one_machine(project, tmp_path_factory.mktemp("spawn"), *SETTINGS)


def test_sbatch_trains_two_tasks_bitwise_equal_to_the_spawn_path(cluster, project, spawn_reference, tmp_path):
    env = job_env(cluster, project)
    job = submit(env, project, *SETTINGS, "--output-dir", str(tmp_path))
    state = wait_for(env, job)
    log = (project / f"slurm-{job}.out").read_text(encoding="utf-8")
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), (state, log)
    assert (project / "logs" / f"slurm-{job}-node0.out").is_file()  # the node's own log
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text("utf-8")
        assert f"rank {rank} of 2 started on cpu" in log and "started by srun," in log
    assert_bitwise_equal(spawn_reference, tmp_path)
    finished = completions(cluster)
    print("sacct --completion:", *finished, sep="\n  ")  # shown with pytest -rP
    assert any(line.startswith(f"{job}|COMPLETED|0:0") for line in finished), finished


def test_usr1_saves_stops_requeues_and_the_job_ends_bitwise_equal(cluster, project, spawn_reference, tmp_path):
    env = job_env(cluster, project)
    job = submit(env, project, *SETTINGS, "--checkpoint-every", "20", "--output-dir", str(tmp_path))
    deadline = time.monotonic() + 240
    while not list((tmp_path / "checkpoints").glob("step-*.pt")):
        assert job_state(env, job).get("JobState") in ("PENDING", "RUNNING") and time.monotonic() < deadline
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)  # as Slurm does 90 s before the end
    while job_state(env, job).get("Restarts", "0") == "0":
        assert time.monotonic() < deadline, job_state(env, job)
        time.sleep(0.5)
    # A requeued job waits until the old job credentials expire: 120 s by default, 10 s on this test cluster
    # (AuthInfo=cred_expire); starting it earlier fails with "Job credential revoked".
    state = wait_for(env, job)
    log = (project / f"slurm-{job}.out").read_text(encoding="utf-8")
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", (state, log)
    assert "the ranks saved a checkpoint on SIGUSR1; requeueing" in log
    rank0 = (tmp_path / "logs" / "rank0.log").read_text(encoding="utf-8")
    assert "on SIGUSR1 (a time limit or preemption is near)" in rank0 and "resumed from" in rank0
    assert_bitwise_equal(spawn_reference, tmp_path)
    print("sacct --completion:", *completions(cluster), sep="\n  ")  # shown with pytest -rP


def test_the_job_script_run_outside_slurm_says_how_to_submit_it(project):
    run = subprocess.run(["bash", "scripts/train.sbatch"], cwd=project, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})  # fmt: skip
    assert run.returncode == 2
    assert "is a Slurm job script: submit it with sbatch scripts/train.sbatch" in run.stderr


def test_more_tasks_than_gpus_fails_the_job_with_the_count_and_the_fix(cluster, project, tmp_path):
    import torch  # here: every pytest worker collects this module

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs: the job would be valid")
    env = job_env(cluster, project)
    job = submit(env, project, *SETTINGS, "--device", "cuda", "--epochs", "1", "--output-dir", str(tmp_path))
    state = wait_for(env, job)
    # 1: a rank's own status; 143: srun stopped its peer first (SIGTERM)
    assert state["JobState"] == "FAILED" and state["ExitCode"] in ("1:0", "143:0"), state
    node_log = (project / "logs" / f"slurm-{job}-node0.out").read_text(encoding="utf-8")
    # Each task sees only the GPUs Slurm bound to it: 1 for plain DDP.
    assert f"1 GPU(s) needed for this Slurm task with parallelism=ddp, {torch.cuda.device_count()} visible" in node_log
    assert not (tmp_path / "checkpoints").exists()
