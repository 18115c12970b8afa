"""The tests' own torchrun: one process that imports torch once, then forks the ranks of each run it is given.

    python tests/forked_ranks.py PACKAGE     (started by conftest's in_forked_ranks; POSIX only)

Each line on stdin is a run of `python -m PACKAGE.MODULE ARGS` (train or evaluate): {"module", "args", "env",
"cwd", "timeout"}. Each rank is a fork of this process with torchrun's variables set (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), and the run's store
lives in a fork of its own, as torchrun's agent hosts it; so the module's main() joins as that rank: the
torchrun path of the real program, from its settings to what it saves. A fork skips what a new rank pays
before and after its work: the interpreter's start, `import torch`, the `torch._dynamo` import in
DistributedDataParallel's constructor, and the interpreter's teardown of those modules.

The answer is one line, {"returncode", "stdout", "stderr"}: the ranks' outputs one after the other (rank 0
first) and, as under torchrun, the first failed rank's status; the other ranks are stopped soon after one fails.
A rank that has to be stopped first writes its threads' stacks into its stderr, so a hang shows where it waits.

For the tests that check what a recipe computes. How ranks start, restart, stop and end is tested through the
real launchers (spawn, torchrun, srun), never through this.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
import io
import json
import os
import signal
import sys
import tempfile
import time
import traceback

import torch  # noqa: F401  imported once, here: every fork has it
import torch._dynamo  # noqa: F401  DistributedDataParallel's constructor imports it
import torch.distributed  # noqa: F401
import torch.nn.parallel  # noqa: F401

KILLED = -signal.SIGKILL
PEERS_GRACE_S = 10  # how long the other ranks get to end after one has failed
DUMP_STACKS = signal.SIGUSR2  # a rank about to be killed first writes every thread's stack to its stderr


def store_host() -> tuple[int, int]:
    """A fork that hosts the run's TCPStore, as torchrun's agent does (it outlives every rank): (its pid, its port).

    The ranks get TORCHELASTIC_USE_AGENT_STORE=True and connect to it as under torchrun; no rank hosts the
    store, so no rank's end takes it away from the others. The store binds a port of the kernel's choosing.
    """
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reading)
        quiet = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1):  # not the requests' and answers' pipes
            os.dup2(quiet, stream)
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        os.write(writing, f"{store.port}\n".encode())
        while True:
            signal.pause()
    os.close(writing)
    with os.fdopen(reading, encoding="utf-8") as answer:
        return pid, int(answer.readline())


def rank_process(program, args: list[str], env: dict, cwd: str, variables: dict, output: tuple[int, int]) -> None:
    """In the fork: become the rank that torchrun would start with `variables`, run main(), and exit."""
    os.dup2(output[0], 1)
    os.dup2(output[1], 2)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115  stdin is the requests' pipe
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8", line_buffering=True)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8", line_buffering=True)  # noqa: SIM115
    faulthandler.enable(sys.stderr, all_threads=True)  # a crash in torch's C++ leaves its stack, not silence
    faulthandler.register(DUMP_STACKS, sys.stderr, all_threads=True)
    os.environ.clear()
    os.environ.update({**env, **variables})
    os.chdir(cwd)
    sys.path[:0] = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    sys.argv = [program.__file__, *args]
    # As under `python -m`: a spawned DataLoader worker then imports the program, not this file, as its main module.
    sys.modules["__main__"] = program
    try:
        status = program.main(args)
    except SystemExit as leaving:
        status = 0 if leaving.code is None else leaving.code if isinstance(leaving.code, int) else 1
    except BaseException:
        traceback.print_exc()
        status = 1
    # The end of a program, without the interpreter's teardown of the ~3000 modules that torch and torch._dynamo
    # loaded (2-3 s a rank on 2 busy cores): atexit handlers, then the streams flushed, then gone.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def ranks_needed(program, args: list[str], env: dict, cwd: str) -> int:
    """nproc_per_node of this run, read by the module's own command line (train or evaluate)."""
    before = dict(os.environ)  # the settings read the environment and relative paths as a rank would
    os.environ.clear()
    os.environ.update(env)
    try:
        os.chdir(cwd)
        if program.__name__.endswith(".evaluate"):
            return program.from_command_line(args)[0].nproc_per_node
        return program.from_command_line(args, "train").nproc_per_node
    finally:
        os.environ.clear()
        os.environ.update(before)


def run(programs: dict, request: dict) -> dict:
    program, args, env, cwd = programs[request["module"]], request["args"], request["env"], request["cwd"]
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused), contextlib.redirect_stdout(refused):
            ranks = ranks_needed(program, args, env, cwd)
    except SystemExit as leaving:  # a bad flag or file: argparse's message, as the program prints it
        return {"returncode": leaving.code if isinstance(leaving.code, int) else 2, "stdout": "",
                "stderr": refused.getvalue()}  # fmt: skip
    host, port = store_host()
    variables = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}  # fmt: skip
    outputs, children = [], []
    for rank in range(ranks):
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        outputs.append((out, err))
        pid = os.fork()
        if pid == 0:
            rank_process(program, args, env, cwd, {**variables, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                         (out.fileno(), err.fileno()))  # fmt: skip
        children.append(pid)
    deadline = time.monotonic() + request["timeout"]
    statuses = {}
    while len(statuses) < len(children):
        for pid in children:
            if pid not in statuses:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses[pid] = os.waitstatus_to_exitcode(status)
                    if statuses[pid] != 0:  # the others may wait for it in a collective: they get a while to end
                        deadline = min(deadline, time.monotonic() + PEERS_GRACE_S)
        if time.monotonic() > deadline:
            stop(children, statuses)
        time.sleep(0.01)
    os.kill(host, signal.SIGKILL)
    os.waitpid(host, 0)
    texts = []
    for out, err in outputs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")))
        out.close()
        err.close()
    failed = [statuses[pid] for pid in children if statuses[pid] != 0]
    stderr = "".join(text[1] for text in texts)
    if failed:  # which rank ended how, as torchrun's summary says
        stderr += "".join(f"forked rank {rank} ended with {statuses[pid]}\n" for rank, pid in enumerate(children))
    return {"returncode": failed[0] if failed else 0, "stdout": "".join(text[0] for text in texts), "stderr": stderr}


def stop(children: list[int], statuses: dict) -> None:
    """Kill the ranks still running, each after it has written its threads' stacks (the test shows where it hung)."""
    running = [pid for pid in children if pid not in statuses]
    for pid in running:
        os.kill(pid, DUMP_STACKS)
    time.sleep(1)
    for pid in running:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        statuses[pid] = KILLED


def serve(package: str) -> None:
    programs = {module: importlib.import_module(f"{package}.{module}") for module in ("train", "evaluate")}
    importlib.import_module(f"{package}.engine.rank")  # the rank's modules, so no fork imports them again
    answers = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write into the answers' pipe
    print("ready", file=answers, flush=True)
    for line in sys.stdin:
        answers.write(json.dumps(run(programs, json.loads(line))) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
