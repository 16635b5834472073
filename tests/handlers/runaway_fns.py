"""Handlers that overrun their timeout, mark files, or block the event loop."""
import time
from pathlib import Path


def spin(event, context):
    """Never returns (a gentle spin: it sleeps, so the machine's two cores stay usable)."""
    while True:
        time.sleep(0.02)


def record(event, context):
    """Marks that it started (a side effect), then sleeps."""
    Path(event["mark"]).write_text("started")
    time.sleep(float(event.get("sleep", 0)))
    return "done"


async def blocks_loop(event, context):
    time.sleep(float(event.get("sleep", 1)))  # the mistake the loop-lag monitor reports
    return "slept"


def burn(event, context):
    """Never returns, and never leaves the GIL but when made to: pure Python on a CPU."""
    while True:
        pass


def swallow(event, context):
    """Swallows what stops it (a bare except) twice, then lets the third one end it, noting each."""
    mark = Path(event["mark"])
    caught = 0
    while True:
        try:
            while True:
                pass
        except BaseException:  # the mistake under test
            caught += 1
            mark.write_text(str(caught))
            if caught >= 2:
                raise


def stuck(event, context):
    """Blocked in one C call for an hour: what no stop reaches (it lands when the call returns)."""
    time.sleep(3600)


def forks(event, context):
    """Forks without exec (as multiprocessing's default does) a child that lingers; answers its pid."""
    import os
    pid = os.fork()
    if pid == 0:  # the child: holds whatever the fork gave it, for a while
        time.sleep(float(event.get("linger", 30)))
        os._exit(0)
    return pid


def forks_in_a_thread(event, context):
    """`forks`, from a thread of the handler's own that ends at once (not the pool's): answers the pid."""
    import threading
    pids = []
    thread = threading.Thread(target=lambda: pids.append(forks(event, context)))
    thread.start()
    thread.join()
    return pids[0]


def spawns(event, context):
    """Starts a subprocess and its grandchild (sh running sleep) and returns without waiting."""
    import subprocess
    proc = subprocess.Popen(["sh", "-c", f"sleep {float(event.get('linger', 60))} & echo $!; wait"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return {"child": proc.pid, "grandchild": int(proc.stdout.readline())}


def detaches(event, context):
    """A daemon's double fork: the grandchild calls setsid() (leaving every process group), its parent
    exits at once; answers the grandchild's pid (read from a pipe)."""
    import os
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        if os.fork() == 0:
            os.setsid()
            os.write(write, str(os.getpid()).encode())
            os.close(write)
            time.sleep(float(event.get("linger", 60)))
            os._exit(0)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        return int(f.read())


def holds(event, context):
    """Marks that it started (a file of its own in `marks`), then holds its thread until `release` exists."""
    import uuid
    Path(event["marks"], uuid.uuid4().hex).touch()
    release = Path(event["release"])
    while not release.exists():
        time.sleep(0.01)
    return "released"


def exit_status_later(event, context):
    """Starts `sh -c 'exit N'` and collects its status `wait` seconds after it ended."""
    import subprocess
    proc = subprocess.Popen(["sh", "-c", f"exit {int(event.get('code', 7))}"])
    time.sleep(float(event.get("wait", 4)))
    return proc.wait()


async def async_exit_status(event, context):
    """An `async def` handler's subprocess, collected the asyncio way."""
    import asyncio
    proc = await asyncio.create_subprocess_exec("sh", "-c", f"exit {int(event.get('code', 7))}")
    await asyncio.sleep(float(event.get("wait", 0)))
    return await proc.wait()
