"""Fork server that runs *inside* the sandbox (standalone: stdlib only, never imports agentrl).

The runner starts the interpreter with a small bootstrap that reads this source from stdin and
executes it as ``__main__`` (argv[2] is a JSON config).  It talks to the runner over the file
descriptors it was started with as stdin/stdout, which it moves out of the way at start-up;
messages are a 4-byte big-endian length followed by UTF-8 JSON.  Under bwrap it is the PID
namespace's init (pid 1): orphans are re-parented to it, and signals sent from inside the
namespace cannot kill or stop it.

Per ``run_code`` job it forks one fresh child, which

1. starts a new session, gets its own pipes for stdin/stdout/stderr and a report pipe on fd 3,
   a fresh work directory under /tmp and a cleared environment;
2. lowers its resource limits (address space, CPU, processes, file size, core dumps);
3. runs the harness: ``setup``, then the solution, then each test in a copy of the solution's
   namespace, writing one line per event to fd 3.  A passing test is reported with that test's
   per-run random token, written only after ``exec`` of the test returned normally.

A ``run_tests`` job gets two children instead, the test program and the solution's process
(section "split runs" below): the solution never runs in the process that holds the tests, the
expected values or the tokens.  Only a job whose every test is decided by runner-held sites
(``split`` false in the job: the runner compares every value, and nothing in the job is secret)
runs in one child like ``run_code``.

The server meanwhile reads the children's output (bounded), enforces the wall-time limit, and at the
end kills every process the run left behind, reaps them, wipes /tmp and removes SysV IPC
objects, so that the next run starts clean.  It never executes solution code itself.
"""

import base64
import builtins
import collections
import ctypes
import functools
import io
import itertools
import json
import marshal
import os
import re
import resource
import select
import signal
import struct
import sys
import time
import types
import warnings

# References the harness needs after untrusted code has run (a solution that monkeypatches
# ``os.write`` or ``builtins.exec`` must not change how results are reported).
_write = os.write
_exit = os._exit
_exec = builtins.exec
_compile = builtins.compile
_type = builtins.type
_str = builtins.str
_len = builtins.len
_isinstance = builtins.isinstance
_BaseException = BaseException
_SystemExit = SystemExit
_dict = dict
_list = list
_range = range
_settrace = sys.settrace
_setprofile = sys.setprofile
_BUILTINS = dict(builtins.__dict__)
_builtins_dict = builtins.__dict__
_AssertionError = AssertionError
_callable = builtins.callable
_sys_modules = sys.modules
_json_dumps = json.dumps
_b64 = base64.b64encode
_dumps = marshal.dumps
_loads = marshal.loads

REPORT_FD = 3
# sys.setrecursionlimit() is capped at this: CPython 3.11+ keeps Python frames on the heap, so
# runaway recursion under a raised limit would otherwise crawl until the time or memory limit
# instead of failing fast with RecursionError.
MAX_RECURSION = 100_000
REPORT_CAP = 1 << 20  # bytes of report lines kept per run
PRELOAD = (
    "math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
    "typing", "random", "statistics", "fractions", "decimal", "operator", "copy", "json",
    "hashlib", "datetime", "array", "dataclasses", "unittest", "subprocess", "threading",
    "traceback", "io",
)
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
# Set by main() from the runner's config: inside a sandbox the server owns /tmp, /dev/shm, the
# IPC namespace and the PID namespace; outside one (subprocess backend) only its own temp dir.
CONTAINED = False
TMP_ROOT = "/tmp"
# The worker's run cgroup (agentrl/sandbox/cgroup.py): descriptors opened by the runner,
# {"procs": [fd...], "mem": fd, "pids": fd or None, "oom": fd}, or None (rlimits only).
CGROUP = None
_CG_SET = {}  # limit values last written, per file descriptor
WIPE_S = 2.0  # longest cleanup of /tmp & co. after a run; past it the sandbox is restarted


# ---------------------------------------------------------------- control channel


def _read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def _send(fd, obj):
    body = json.dumps(obj).encode()
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(fd, data):]


# ---------------------------------------------------------------- process hygiene


def _prctl(option, value):
    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        _LIBC[0].prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _descendants(root_pid):
    """PIDs whose parent chain leads to ``root_pid`` (read from /proc)."""
    parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        parent[int(name)] = int(fields[1])
    out = []
    for pid in parent:
        p, seen = pid, 0
        while p in parent and seen < 4096:
            p = parent[p]
            seen += 1
            if p == root_pid:
                out.append(pid)
                break
    return out


def _reap_all():
    """Reap every exited child; return True when no child is left at all."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _kill_everything(contained):
    """SIGKILL every process this server started (directly or not) and reap them.

    Inside a PID namespace ``kill(-1)`` reaches every process of our uid except ourselves
    (the namespace's init).  Outside one (subprocess backend) we walk /proc for descendants:
    as a child subreaper, orphans of the run are re-parented to us, so they are descendants.
    """
    me = os.getpid()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if contained:
            try:
                os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        else:
            for pid in _descendants(me):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if _reap_all():
            return True
        time.sleep(0.001)
    return False


def _wipe(path, deadline):
    """Remove everything below ``path`` (not ``path`` itself); True iff it is empty afterwards.

    Works for trees of any depth and any names with O(1) open descriptors and no recursion
    (a tree deeper than PATH_MAX, or deeper than Python's recursion limit, used to survive):
    the entries of every directory directly below ``path`` are unlinked, its subdirectories are
    renamed up into ``path`` itself (``renameat``) and handled the same way, then it is removed.
    Permissions the run took away are restored on the way (the server has the run's uid).
    Gives up at ``deadline`` (``time.monotonic()``) and returns False: the caller then
    restarts the sandbox, whose mount namespace (and tmpfs) dies with it.
    """
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    hoisted = 0
    try:
        previous = None
        while True:
            try:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(top)]
            except OSError:
                return False
            if not entries:
                return True
            if entries == previous:  # a whole pass changed nothing: give up
                return False
            previous = entries
            for name, is_dir in entries:
                if time.monotonic() > deadline:
                    return False
                try:
                    if not is_dir:
                        os.unlink(name, dir_fd=top)
                        continue
                    os.chmod(name, 0o700, dir_fd=top)
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                    try:
                        for e in os.scandir(sub):
                            if time.monotonic() > deadline:
                                return False
                            if not e.is_dir(follow_symlinks=False):
                                os.unlink(e.name, dir_fd=sub)
                                continue
                            os.chmod(e.name, 0o700, dir_fd=sub)  # renaming a dir writes its '..'
                            while True:
                                hoisted += 1
                                try:
                                    os.rename(e.name, f".agentrl-wipe-{hoisted}", src_dir_fd=sub,
                                              dst_dir_fd=top)
                                    break
                                except (FileExistsError, IsADirectoryError, NotADirectoryError):
                                    continue
                                except OSError as err:
                                    if err.errno != 39:  # ENOTEMPTY: that name is taken
                                        raise
                    finally:
                        os.close(sub)
                    os.rmdir(name, dir_fd=top)
                except OSError:
                    pass  # retried on the next pass over ``path`` (until the deadline)
    finally:
        os.close(top)


def _remove_sysv_ipc():
    """Delete SysV shared memory, semaphores and message queues (they outlive processes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    ipc_rmid = 0
    for kind, fn in (("shm", "shmctl"), ("sem", "semctl"), ("msg", "msgctl")):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 1:
                if kind == "sem":
                    getattr(libc, fn)(int(parts[1]), 0, ipc_rmid)
                else:
                    getattr(libc, fn)(int(parts[1]), ipc_rmid, None)


# keyctl(2) syscall numbers (asm/unistd_64.h; asm-generic/unistd.h); elsewhere keyrings are
# left alone and docs/sandbox.md's keyring guarantee does not hold
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 1, 7, 22
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5


_LIBC = []


def _keyctl(*args):
    """keyctl(2) through libc's syscall(); -1 where the call or the architecture is unknown."""
    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        nr = _SYS_KEYCTL[os.uname().machine]
        return _LIBC[0].syscall(nr, *[ctypes.c_long(a) for a in args])
    except (KeyError, OSError, AttributeError):
        return -1


def _new_session_keyring():
    """Join a fresh anonymous session keyring (the run's keys die with its processes)."""
    _keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0)


def _clear_keyrings():
    """Empty the uid's keyrings that outlive processes: user, user-session and persistent.

    Keys and keyrings a run links there would otherwise be visible to the next run (user
    keyrings belong to the sandbox's user namespace, so other workers never share them).
    """
    persistent = _keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_USER_SESSION_KEYRING)
    if persistent > 0:
        _keyctl(KEYCTL_CLEAR, persistent)
    _keyctl(KEYCTL_CLEAR, KEY_SPEC_USER_SESSION_KEYRING)
    _keyctl(KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING)


# main() ignores every catchable signal in the server (a pid 1 with a handler, such as Python's
# SIGINT one, can be signalled from inside its namespace); each run's child gets the
# dispositions a Python interpreter starts with (SIGINT -> KeyboardInterrupt, SIGPIPE and SIGXFSZ
# ignored, the rest default) -- not the ones this server inherited: a run launched with SIGINT
# ignored (a background job of a shell, `nohup ... &`) would otherwise hand that to the code it
# tests.
_SIGNALS = []
_PYTHON_START = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
                 signal.SIGXFSZ: signal.SIG_IGN}


def _ignore_signals():
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            signal.signal(sig, signal.SIG_IGN)
            _SIGNALS.append(sig)
        except (OSError, ValueError, RuntimeError):
            pass


def _restore_signals():
    for sig in _SIGNALS:
        try:
            signal.signal(sig, _PYTHON_START.get(sig, signal.SIG_DFL))
        except (OSError, ValueError, TypeError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _cg_write(fd, value):
    """Write a cgroup limit (only when it changed since the last write)."""
    if _CG_SET.get(fd) != value:
        os.pwrite(fd, value.encode(), 0)
        _CG_SET[fd] = value


def _cg_oom_kills():
    """The run cgroup's OOM-kill counter (``oom_kill N`` of memory.oom_control / .events)."""
    try:
        for line in os.pread(CGROUP["oom"], 4096, 0).decode().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


# ---------------------------------------------------------------- plain data (trusted helpers)
#
# Tests are rewritten by the runner (agentrl/sandbox/rewrite.py) to call these helpers instead
# of comparing, asserting or negating directly.  They accept *exact* built-in types only
# (``type(x) is int``, never isinstance), so no method of an object the solution made is ever
# called to decide a comparison.  Everything they use is bound here, at server start, before
# any solution code exists.

# re.Match: a C type whose truth is always True and whose == is identity (MBPP's regex tasks
# return it), kept as is; encoded for the runner as an opaque always-true token
_ATOMS = frozenset({int, float, complex, str, bytes, bool, type(None), range, type(Ellipsis),
                    re.Match})
_SEQS = frozenset({list, tuple})
_SETS = frozenset({set, frozenset})
# dict and the stdlib's C-level (or dict-method-only) subclasses; read through dict's own items
_DICTS = frozenset({dict, collections.OrderedDict, collections.defaultdict, collections.Counter})
_dict_items = dict.items
_type_type = type
# results of a solution function that pass through unconverted: lazy iterables whose items are
# checked wherever they are compared
_LAZY = frozenset({types.GeneratorType, map, filter, zip, enumerate, reversed,
                   type(iter([])), type(iter(())), type(iter("")), type(iter(range(0)))})
_CMP = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
        "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
        "is": lambda a, b: a is b, "is not": lambda a, b: a is not b}
MAX_DEPTH = 200


def _not_plain(x):
    try:
        name = _type(x).__name__
    except _BaseException:
        name = "?"
    return _AssertionError(f"not plain data: a value of type {name} (only exact built-in "
                           "types are compared)")


_LEAVES = _ATOMS | {type}  # a `type` object compares by identity
_CONTAINERS = _SEQS | _SETS
_dict_keys = dict.keys
_dict_values = dict.values
_set = set
_map = map
_chain = itertools.chain.from_iterable


def _check(x, depth=0, _t=_type, _leaves=_LEAVES):
    """Raise AssertionError unless ``x`` is plain data (exact built-in types, recursively).

    Containers of leaves (and containers of containers of leaves) are checked with C-level
    passes (``set(map(type, ...))``): outputs of millions of tuples cost about a second.
    """
    t = _t(x)
    if t in _leaves:
        return
    if depth > MAX_DEPTH:
        raise _AssertionError("not plain data: nested too deeply")
    if t in _CONTAINERS:
        kinds = _set(_map(_t, x))
        if kinds <= _leaves or (kinds <= _CONTAINERS and _set(_map(_t, _chain(x))) <= _leaves):
            return
        for v in x:
            if _t(v) not in _leaves:
                _check(v, depth + 1)
    elif t in _DICTS:
        if _set(_map(_t, _dict_keys(x))) <= _leaves and _set(_map(_t, _dict_values(x))) <= _leaves:
            return
        for k, v in _dict_items(x):
            _check(k, depth + 1)
            _check(v, depth + 1)
    else:
        raise _not_plain(x)


def _enc(x, depth=0, _t=_type):
    """Plain data -> JSON-able value with tags for what JSON lacks (decoded by the runner)."""
    t = _t(x)
    if t in (int, str, bool, float) or x is None:
        return x
    if depth > MAX_DEPTH:
        raise _AssertionError("not plain data: nested too deeply")
    if t is list:
        return [_enc(v, depth + 1) for v in x]
    if t is tuple:
        return {"t": [_enc(v, depth + 1) for v in x]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [_enc(v, depth + 1) for v in x]}
    if t in _DICTS:
        return {"d": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in _dict_items(x)]}
    if t is bytes:
        return {"b": _b64(x).decode()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    if t is range:
        return {"r": [x.start, x.stop, x.step]}
    if t is re.Match:
        return {"m": 1}
    raise _not_plain(x)


# The last result a wrapped solution function returned, already checked: comparing it right
# away (EvalPlus: ``out == exp``) need not walk it again.  Only solution code could change it in
# between, and any call into the solution replaces this entry first.
_CHECKED = [None]


def _h_cmp(op, a, b, _cmp=_CMP, _check=_check, _checked=_CHECKED):
    if op != "is" and op != "is not":
        if a is not _checked[0]:
            _check(a)
        if b is not _checked[0]:
            _check(b)
    return _cmp[op](a, b)


def _h_chain(ops, *values, _cmp=_CMP, _check=_check):
    for i, op in enumerate(ops):
        a, b = values[i], values[i + 1]
        if op != "is" and op != "is not":
            _check(a)
            _check(b)
        if not _cmp[op](a, b):
            return False
    return True


def _h_truth(x, _check=_check):
    _check(x)
    return True if x else False


def _bake(code, helpers, _t=_type, _code_type=types.CodeType):
    """``code`` with the helper placeholders among its constants (recursively) replaced by the
    helper functions: rebinding any *name* in the test's globals cannot reach them."""
    consts = []
    for c in code.co_consts:
        if _t(c) is _code_type:
            c = _bake(c, helpers)
        elif _t(c) is _str and c in helpers:
            c = helpers[c]
        consts.append(c)
    return code.replace(co_consts=tuple(consts))


def _snapshot_modules(names):
    """[(name, module, copy of its dict)] for the modules named in ``names`` (and submodules)."""
    tops = {n.split(".")[0] for n in names}
    out = []
    for name, mod in list(_sys_modules.items()):
        if _type(mod) is types.ModuleType and name.split(".")[0] in tops:
            out.append((name, mod, dict(mod.__dict__)))
    return out


_MISSING = object()


def _restore_modules(snap, _missing=_MISSING):
    """Undo changes of the solution to the snapshot's module attributes and sys.modules."""
    for name, mod, saved in snap:
        try:
            if _sys_modules.get(name) is not mod:
                _sys_modules[name] = mod
            d = mod.__dict__
            for k, v in saved.items():
                if d.get(k, _missing) is not v:
                    d[k] = v
        except _BaseException:
            pass


# ---------------------------------------------------------------- the child: harness


def _rep(line):
    """Write one report line (bounded, escaped to a single line) to the report fd."""
    try:
        # backslashreplace: a message with lone surrogates must still be reported
        line = line.encode("utf-8", "backslashreplace").decode("utf-8")
        text = line.replace("\\", "\\\\").replace("\n", "\\n")[:4000] + "\n"
        _write(REPORT_FD, text.encode())
    except _BaseException:
        pass


def _describe(exc, source=None, filename=None):
    """'Type: message (at `line`)' for an exception, robust to hostile __str__."""
    try:
        name = _type(exc).__name__
    except _BaseException:
        name = "Exception"
    try:
        msg = _str(exc)[:500]
    except _BaseException:
        msg = "<unprintable>"
    text = f"{name}: {msg}" if msg else name
    if filename is not None:
        # the runner turns '@L<n>' into the original source line (tests are rewritten)
        try:
            lineno, tb = None, exc.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == filename:
                    lineno = tb.tb_lineno
                tb = tb.tb_next
            if lineno is not None:
                text += f" @L{lineno}"
        except _BaseException:
            pass
    return text


def _rep_expect(i, k, value, cap=1 << 18):
    """Report the plain-data value of expectation site ``k`` of test ``i`` (runner compares)."""
    try:
        body = _json_dumps(_enc(value), separators=(",", ":"))
    except _BaseException as e:
        body = "!" + _describe(e)
    if _len(body) > cap:
        body = "!value too large to report"
    try:
        _write(REPORT_FD, (f"E {i} {k} " + body.replace("\\", "\\\\") + "\n").encode())
    except _BaseException:
        pass


def _compile_tests(tests):
    """Each rewritten test compiled with the runner's helpers baked in (its code object), or
    the description of its compile error (a str)."""
    helpers = {"\x00agentrl:agentrl_cmp": _h_cmp, "\x00agentrl:agentrl_chain": _h_chain,
               "\x00agentrl:agentrl_truth": _h_truth}
    compiled = []
    saved_filters = warnings.filters[:]
    warnings.simplefilter("ignore")  # "'str' object is not callable": the helper placeholders
    for i, src in enumerate(tests):
        try:
            c = _compile(src, f"<test {i}>", "exec")
            expect = functools.partial(_rep_expect, i)
            compiled.append(_bake(c, {**helpers, "\x00agentrl:agentrl_expect": expect}))
        except _BaseException as e:
            compiled.append(_describe(e))
    warnings.filters[:] = saved_filters
    getattr(warnings, "_filters_mutated", lambda: None)()
    return compiled


def _restore_builtins():
    try:
        for key in [k for k in _builtins_dict if k not in _BUILTINS]:
            del _builtins_dict[key]
        _builtins_dict.update(_BUILTINS)
    except _BaseException:
        pass


def _harness(job, finish):
    """Run setup, solution and tests in one process; report over fd 3; leave through ``finish``
    (never returns).  Used for ``run_code`` (no tests) and for ``run_tests`` jobs whose
    tests are all decided by runner-held sites (``split`` false: nothing this process reports
    can grant a pass without the expected values); other ``run_tests`` jobs split the run in
    two (``_test_program`` and ``_solution_process``)."""
    tokens = job["tokens"]
    tests = job["tests"]
    mode = job["mode"]
    ns_name = "__main__" if mode == "code" else "solution"
    module = _type(sys)(ns_name)
    ns = module.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.modules[ns_name] = module
    try:
        setup_c = _compile(job["setup"], "<setup>", "exec")
    except _BaseException as e:
        _rep("R " + _describe(e) + " [in setup]")
        finish()
    try:
        code_c = _compile(job["code"], "<solution>", "exec")
    except MemoryError as e:  # too big to compile within the memory limit: not a syntax error
        _rep("R " + _describe(e))
        finish()
    except _BaseException as e:
        _rep("S " + _describe(e))
        finish()
    compiled = _compile_tests(tests)
    imports = job.get("imports") or []
    for name in imports:  # what tests import is loaded (and snapshotted) before the solution
        try:
            __import__(name)
        except _BaseException:
            pass
    modules = _snapshot_modules(imports) if imports else ()
    code_token = tokens[0]
    test_tokens = tokens[1:]
    del job, tokens
    try:
        _exec(setup_c, ns)
        _exec(code_c, ns)
    except _SystemExit as e:
        if mode != "code" or e.code not in (None, 0):
            _rep("R " + _describe(e))
            finish()
    except _BaseException as e:
        _rep("R " + _describe(e, None))
        finish()
    _rep("C " + code_token)
    for i in _range(_len(tests)):
        _settrace(None)
        _setprofile(None)
        _restore_builtins()
        _restore_modules(modules)
        _CHECKED[0] = None
        _rep(f"T {i}")
        if _isinstance(compiled[i], _str):
            _rep(f"F {i} SyntaxError in test: {compiled[i]}")
            continue
        test_ns = _dict(ns)
        test_ns["__builtins__"] = _dict(_BUILTINS)
        try:
            _exec(compiled[i], test_ns)
        except _BaseException as e:
            _rep(f"F {i} " + _describe(e, tests[i], f"<test {i}>"))
            continue
        _rep(f"P {i} {test_tokens[i]}")
    _rep("D")
    finish()


# ---------------------------------------------------------------- split runs: tests and solution
#
# ``run_tests`` runs two processes per run.  The test program (T: setup, tests, references,
# expected values, the per-run tokens) never executes solution code; the solution runs in its
# own process (C), forked from the server before the tests and tokens ever reach this process
# (they are spliced from the runner's pipe straight into T's).  Every call a test makes to a
# function the solution defined goes to C as plain data and comes back as plain data (a
# marshal blob of exact built-in types, checked by T after loading) or as an exception; C can
# only choose the bytes of its answers, which an honest function could have returned too.

_pack_len = struct.Struct(">Q").pack
_unpack_len = struct.Struct(">Q").unpack
_bytearray = bytearray
_memoryview = memoryview
_HANDLE = "\x00agentrl:handle"


def _msg_send(fd, blob):
    """Write one message: an 8-byte length and ``blob`` (bytes; small ones in one write)."""
    if _len(blob) < 1 << 16:
        _write_all(fd, _pack_len(_len(blob)) + blob)
        return
    _write_all(fd, _pack_len(_len(blob)))
    _write_all(fd, blob)


def _write_all(fd, data):
    view = _memoryview(data)
    while view:
        view = view[_write(fd, view):]


def _msg_recv(fd):
    """Read one message's bytes; None at end of file (the other side is gone)."""
    head = _read_exact(fd, 8)
    if head is None:
        return None
    n = _unpack_len(head)[0]
    buf = _bytearray(n)
    view = _memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if not k:
            return None
        got += k
    return buf


class SolutionProcessDied(BaseException):
    """The solution's process ended while a test waited for it (not an ``Exception``: a test's
    ``except Exception`` must not turn a dead solution into an expected failure)."""


class SolutionError(Exception):
    """An exception of a type the test program does not have (one the solution defined)."""


class _Remote:
    """An object of the solution that is not plain data, seen from the test program: opaque,
    it can only be passed back to the solution's functions (MBPP's ``Pair``); comparing,
    asserting or computing with it fails."""

    __slots__ = ("_agentrl_id", "_agentrl_type")

    def __init__(self, ident, tname):
        self._agentrl_id = ident
        self._agentrl_type = tname

    def __repr__(self):
        return f"<solution object of type {self._agentrl_type}>"


def _to_wire(x, depth=0, _t=_type):
    """Arguments of a call -> what marshal can carry: handles become markers, the stdlib's dict
    subclasses dicts; anything else that is not plain data raises TypeError."""
    t = _t(x)
    if t is _Remote:
        return (_HANDLE, x._agentrl_id)
    if t in (int, float, complex, str, bytes, bool) or x is None or x is Ellipsis:
        return x
    if depth > MAX_DEPTH:
        raise TypeError("argument nested too deeply")
    if t is list:
        return [_to_wire(v, depth + 1) for v in x]
    if t is tuple:
        return tuple(_to_wire(v, depth + 1) for v in x)
    if t is set or t is frozenset:
        return t(_to_wire(v, depth + 1) for v in x)
    if t in _DICTS:
        return {_to_wire(k, depth + 1): _to_wire(v, depth + 1) for k, v in _dict_items(x)}
    raise TypeError(f"an argument of type {t.__name__} cannot be passed to the solution "
                    "(it runs in another process; only plain data and its own objects)")


def _from_wire(x, handles, depth=0, _t=_type):
    """Inverse of ``_to_wire`` in the solution's process (markers -> its objects)."""
    t = _t(x)
    if t is tuple:
        if _len(x) == 2 and x[0] == _HANDLE and _t(x[1]) is int:
            return handles[x[1]]
        return tuple(_from_wire(v, handles, depth + 1) for v in x)
    if t is list:
        return [_from_wire(v, handles, depth + 1) for v in x]
    if t is dict:
        return {_from_wire(k, handles, depth + 1): _from_wire(v, handles, depth + 1)
                for k, v in x.items()}
    if t is set or t is frozenset:
        return t(_from_wire(v, handles, depth + 1) for v in x)
    return x


_MUTABLE = (list, dict, set, bytearray)


def _solution_process(job, streams):
    """C: run setup and the solution, describe its namespace to T, then serve T's calls."""
    module = _type(sys)("solution")
    ns = module.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.modules["solution"] = module

    def flush():
        for stream in streams:
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass

    def answer(obj):
        flush()
        _msg_send(ANSWER_FD, _dumps(obj))

    try:
        setup_c = compile(job["setup"], "<setup>", "exec")
        try:
            code_c = compile(job["code"], "<solution>", "exec")
        except MemoryError as e:
            return answer(("R", _describe(e)))
        except BaseException as e:  # noqa: BLE001
            return answer(("S", _describe(e)))
        del job
        exec(setup_c, ns)
        before = dict(ns)
        exec(code_c, ns)
    except BaseException as e:  # noqa: BLE001 - SystemExit included: the module did not finish
        return answer(("R", _describe(e)))
    handles = {}
    answer(("ok", _manifest(ns, before, handles)))
    while True:
        blob = _msg_recv(CALL_FD)
        if blob is None:
            _exit(0)
        try:
            _, target, args, kwargs, wired = _loads(blob)
            blob = None
            if wired:
                args = _from_wire(args, handles)
                kwargs = _from_wire(kwargs, handles)
            fn = ns[target[1]] if target[0] == "n" else handles[target[1]]
            before_args = _plain_snapshots(args)
            r = fn(*args, **kwargs)
            changed = _changed_args(args, before_args)
            kind, r = _result_kind(r)
        except BaseException as e:  # noqa: BLE001 - relayed to the test as its own exception
            desc = _exception_desc(e)
            try:
                answer(("e", *desc))
            except BaseException:  # noqa: BLE001
                _exit(1)
            continue
        out = _encode_result(kind, r, changed, handles)
        r = None
        flush()
        _msg_send(ANSWER_FD, out)
        out = None  # EvalPlus outputs reach GiBs: hold neither the result nor its bytes


def _manifest(ns, before, handles):
    """What the solution defined (names not in ``before``, the namespace after setup): (name,
    "m", module name), (name, "f", None) for a callable, (name, "v", marshal bytes) for plain
    data, else (name, "h", (handle, type name)) with the value kept in ``handles``."""
    manifest = []
    for key, value in list(ns.items()):
        try:
            if type(key) is not str or (key.startswith("__") and key.endswith("__")):
                continue
            if before.get(key, _MISSING) is value:
                continue
            if type(value) is types.ModuleType:
                manifest.append((key, "m", str(value.__name__)))
            elif callable(value):
                manifest.append((key, "f", None))
            else:
                try:
                    manifest.append((key, "v", _dumps(value)))
                except (ValueError, TypeError):
                    handles[len(handles) + 1] = value
                    manifest.append((key, "h", (len(handles), str(type(value).__name__))))
        except BaseException:  # noqa: BLE001 - a hostile value: leave the name out
            continue
    return tuple(manifest)


def _plain_snapshots(args):
    """Marshal bytes of each mutable plain-data argument, by position, before the call."""
    before_args = {}
    for i, a in enumerate(args):
        if type(a) in _MUTABLE:
            try:
                before_args[i] = _dumps(a)
            except (ValueError, TypeError):
                pass
    return before_args


def _changed_args(args, before_args):
    """((position, marshal bytes or None), ...) of the arguments the call mutated (None: the
    argument now holds something that is not plain data)."""
    changed = []
    for i, old in before_args.items():
        try:
            new = _dumps(args[i])
        except (ValueError, TypeError):  # now holds something that is not plain data
            new = None
        if new != old:
            changed.append((i, new))
    return tuple(changed)


def _result_kind(r):
    """(kind, value) of a call's result: "i" an iterator as its list, "m" a match as its text,
    "g" a range as (start, stop, step), else "r" and the result itself."""
    kind = "r"
    if type(r) in _LAZY:
        kind, r = "i", list(r)
    elif type(r) is re.Match:
        kind, r = "m", r.group(0)
    elif type(r) is range:
        kind, r = "g", (r.start, r.stop, r.step)
    return kind, r


def _exception_desc(e):
    """(module, qualname, message) of an exception the solution raised."""
    try:
        t = type(e)
        return (str(t.__module__), str(t.__qualname__), _describe(e).partition(": ")[2])
    except BaseException:  # noqa: BLE001
        return ("builtins", "Exception", "<unprintable>")


def _encode_result(kind, r, changed, handles):
    """The answer's marshal bytes: the result as plain data (the stdlib's dict subclasses as
    dicts), else an opaque handle for T (the value kept in ``handles``)."""
    try:
        try:
            return _dumps((kind, r, changed))
        except (ValueError, TypeError):  # e.g. a Counter inside: as a dict
            return _dumps((kind, _to_wire(r), changed))
    except BaseException:  # noqa: BLE001 - not plain data: an opaque handle for T
        handles[len(handles) + 1] = r
        try:
            tname = str(type(r).__name__)
        except BaseException:  # noqa: BLE001
            tname = "?"
        return _dumps(("h", (len(handles), tname), changed))


_PLAIN_EXC = frozenset(v for v in builtins.__dict__.values()
                       if _isinstance(v, type) and issubclass(v, BaseException))
_DEAD = [False]


def _exception_from(module, qualname, message):
    """The exception T raises for one the solution raised (built-in types keep their type)."""
    cls = _BUILTINS.get(qualname) if module == "builtins" else None
    if cls in _PLAIN_EXC:
        try:
            return cls(message)
        except _BaseException:
            pass
    return SolutionError(f"{qualname}: {message}" if message else qualname)


def _call(target, args, kwargs, _t=_type, _check=_check, _checked=_CHECKED):
    """T: call the solution's function ``target`` in C and return its result as plain data."""
    _checked[0] = None
    if _DEAD[0]:
        raise SolutionProcessDied("the solution's process has ended")
    try:
        blob = _dumps(("c", target, args, kwargs, False))
    except (ValueError, TypeError):
        blob = _dumps(("c", target, _to_wire(args), _to_wire(kwargs), True))
    try:
        _msg_send(CALL_FD, blob)
        blob = None
        answer = _msg_recv(ANSWER_FD)
    except OSError:
        answer = None
    if answer is None:
        _DEAD[0] = True
        raise SolutionProcessDied("the solution's process ended during the call")
    try:
        msg = _loads(answer)
    except _BaseException:
        raise _AssertionError("the solution's process sent a malformed answer") from None
    answer = None
    if _t(msg) is not tuple or not msg or _t(msg[0]) is not _str:
        raise _AssertionError("the solution's process sent a malformed answer")
    kind = msg[0]
    if kind == "e" and _len(msg) == 4 and all(_t(x) is _str for x in msg[1:]):
        raise _exception_from(msg[1], msg[2], msg[3])
    if _len(msg) != 3 or _t(msg[2]) is not tuple:
        raise _AssertionError("the solution's process sent a malformed answer")
    for item in msg[2]:  # arguments the call changed in place: the same change here
        if _t(item) is tuple and _len(item) == 2 and _t(item[0]) is int \
                and 0 <= item[0] < _len(args):
            if item[1] is None:
                raise _AssertionError("not plain data: the solution put an object that is not "
                                      "plain data into an argument")
            if _t(item[1]) is not bytes:
                continue
            new, old = _loads(item[1]), args[item[0]]
            if _t(new) is _t(old) and _t(old) in _MUTABLE:
                _check(new)
                if _t(old) is dict or _t(old) is set:
                    old.clear()
                    old.update(new)
                else:
                    old[:] = new
    value = msg[1]
    if kind == "h":
        if _t(value) is tuple and _len(value) == 2 and _t(value[0]) is int \
                and _t(value[1]) is _str:
            return _Remote(value[0], value[1])
        raise _AssertionError("the solution's process sent a malformed answer")
    if kind == "m" and (_t(value) is _str or _t(value) is bytes):
        return re.fullmatch(b"(?s).*" if _t(value) is bytes else "(?s).*", value)
    if kind == "g" and _t(value) is tuple and _len(value) == 3:
        return range(*value)
    _check(value)
    if kind == "i" and _t(value) is list:
        return iter(value)
    if kind != "r":
        raise _AssertionError("the solution's process sent a malformed answer")
    _checked[0] = value
    return value


def _proxy(name):
    """T's stand-in for the solution's callable ``name``."""

    def candidate(*args, **kwargs):
        return _call(("n", name), args, kwargs)

    candidate.__name__ = candidate.__qualname__ = name
    return candidate


def _read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _test_program(job, finish):
    """T: setup, then the tests against proxies of the solution's names; reports on fd 3."""
    try:
        part = json.loads(_read_all(TESTS_FD))
        os.close(TESTS_FD)
    except _BaseException as e:
        _rep("X tests not received: " + _describe(e))
        finish()
    tokens, tests, imports = part["tokens"], part["tests"], part.get("imports") or []
    setup = job["setup"]
    may_shadow = frozenset(job.get("site_callees") or ())
    stubs = frozenset(job.get("setup_stubs") or ())
    del part, job
    module = _type(sys)("solution")
    ns = module.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.modules["solution"] = module
    try:
        setup_c = _compile(setup, "<setup>", "exec")
    except _BaseException as e:
        _rep("R " + _describe(e) + " [in setup]")
        finish()
    compiled = _compile_tests(tests)
    for name in imports:
        try:
            __import__(name)
        except _BaseException:
            pass
    modules = _snapshot_modules(imports) if imports else ()
    try:
        _exec(setup_c, ns)
    except _BaseException as e:
        _rep("R " + _describe(e) + " [in setup]")
        finish()
    # what the solution's process says it defined (untrusted: names, kinds and plain values only)
    blob = _msg_recv(ANSWER_FD)
    try:
        msg = _loads(blob) if blob is not None else None
    except _BaseException:
        msg = None
    if _type(msg) is not tuple or _len(msg) != 2 or _type(msg[0]) is not _str:
        _rep("R the solution's process ended before it finished loading")
        finish()
    if msg[0] in ("S", "R") and _type(msg[1]) is _str:
        _rep(msg[0] + " " + msg[1])
        finish()
    if msg[0] != "ok" or _type(msg[1]) is not tuple:
        _rep("R the solution's process sent a malformed answer")
        finish()
    solution_names = _solution_names(msg[1], ns, may_shadow, stubs)
    del msg, blob
    _rep("C " + tokens[0])
    test_tokens = tokens[1:]
    del tokens
    for i in _range(_len(tests)):
        _restore_builtins()
        _restore_modules(modules)
        _CHECKED[0] = None
        _rep(f"T {i}")
        if _isinstance(compiled[i], _str):
            _rep(f"F {i} SyntaxError in test: {compiled[i]}")
            continue
        test_ns = _dict(ns)
        test_ns.update(solution_names)
        test_ns["__builtins__"] = _dict(_BUILTINS)
        try:
            _exec(compiled[i], test_ns)
        except _BaseException as e:
            _rep(f"F {i} " + _describe(e, tests[i], f"<test {i}>"))
            continue
        _rep(f"P {i} {test_tokens[i]}")
    _rep("D")
    finish()


def _solution_names(entries, ns, may_shadow, stubs):
    """The tests' view of what the solution's process says it defined (``entries``, untrusted:
    names, kinds and plain values only): a proxy per function, T's own copy of a module, a
    checked plain value, an opaque `_Remote` per handle.  Malformed entries are left out."""
    solution_names = {}
    for entry in entries:
        try:
            name, kind, payload = entry
            if _type(name) is not _str or not name.isidentifier() or name.startswith("__"):
                continue
            # the solution may not shadow what the tests rely on: a builtin (`abs`, `all`;
            # unless the runner checks that name's results itself: MBPP's `sum` task), a
            # name `setup` imported (`from math import isclose`) or a helper it defines with
            # a body (HumanEval's `encode_shift`, `poly`: tests check answers with them); it
            # may replace the setup's stubs (HumanEval's prompt stubs the entry point)
            prior = ns.get(name, _MISSING)
            if (name in _BUILTINS and name not in may_shadow) or (
                    prior is not _MISSING and not (_type(prior) is types.FunctionType
                                                   and prior.__globals__ is ns
                                                   and name in stubs)):
                continue
            if kind == "f":
                solution_names[name] = _proxy(name)
            elif kind == "m" and _type(payload) is _str and payload in _sys_modules:
                solution_names[name] = _sys_modules[payload]  # T's own copy of the module
            elif kind == "v" and _type(payload) is bytes:
                value = _loads(payload)
                _check(value)
                solution_names[name] = value
            elif kind == "h" and _type(payload) is tuple and _type(payload[0]) is int \
                    and _type(payload[1]) is _str:
                solution_names[name] = _Remote(payload[0], payload[1])
        except _BaseException:
            continue
    return solution_names


# Descriptors of a run's processes (besides 0-2): the harness (T) reports on REPORT_FD, reads the
# tests on TESTS_FD, sends calls on CALL_FD and reads their answers on ANSWER_FD; the solution's
# process (C) has only CALL_FD (to read calls) and ANSWER_FD (to answer), never REPORT_FD.
# STATUS_FD carries a child's own setup failure (``X ...``) and is closed before any job code
# runs: the only channel of the run that the solution can never write (issue 42).
TESTS_FD, CALL_FD, ANSWER_FD, STATUS_FD = 4, 5, 6, 7


def _child(job, fds, limits, nproc_base, role="harness"):
    """Runs in a forked child: isolate, limit, then hand over to ``role``.

    ``fds`` is (stdin, stdout, stderr, {target fd: source fd}); ``role`` is ``harness`` (the
    single-process harness: ``run_code``), ``tests`` (the test program of a split run, T) or
    ``solution`` (the solution's process of a split run, C).
    """
    stdin_fd, out_w, err_w, keep = fds
    rep = keep.get(STATUS_FD, err_w)
    try:
        if CGROUP is not None:  # before anything else: every page of the run is charged there
            for fd in CGROUP["procs"]:
                os.pwrite(fd, b"0", 0)
        high = {}
        for k, (target, src) in enumerate(sorted(keep.items())):
            high[target] = os.dup2(src, 200 + k)
        os.setsid()
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for target, src in high.items():
            os.dup2(src, target)
        rep = STATUS_FD if STATUS_FD in keep else 2
        os.closerange(max(keep, default=2) + 1, 1 << 16)
        for fd in range(3, max(keep, default=2)):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        work = f"{TMP_ROOT}/run{os.getpid()}"
        os.mkdir(work, 0o700)
        os.chdir(work)
        os.environ.clear()
        os.environ.update(
            PATH="/usr/bin:/bin", HOME=work, TMPDIR=work, LANG="C.UTF-8",
            OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
        )
        if role == "tests":
            # the test program keeps ignoring every catchable signal (the solution's process
            # could otherwise interrupt it, e.g. raise KeyboardInterrupt inside a try block) and
            # stays non-dumpable: the solution's process (same uid) cannot ptrace it or read
            # its memory or descriptors (/proc/<pid>/mem, /proc/<pid>/fd, pidfd_getfd)
            _prctl(PR_SET_DUMPABLE, 0)
            sys.path[:] = [p for p in sys.path if p.startswith("/") and not p.startswith(TMP_ROOT)]
        else:
            _restore_signals()
        _new_session_keyring()
        mb = 1 << 20
        cpu = max(1, int(-(-limits["cpu_s"] // 1)))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_size_mb"] * mb),) * 2)
        resource.setrlimit(resource.RLIMIT_AS, (int(limits["memory_mb"] * mb),) * 2)
        if nproc_base is not None:  # no pids cgroup: the uid's process count instead
            nproc = int(limits["max_procs"]) + nproc_base
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), errors="backslashreplace")
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True
        )
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
        if "random" in sys.modules:
            sys.modules["random"].seed()
        real_setrecursionlimit = sys.setrecursionlimit

        def setrecursionlimit(limit):
            real_setrecursionlimit(limit if limit < MAX_RECURSION else MAX_RECURSION)

        setrecursionlimit.__doc__ = real_setrecursionlimit.__doc__
        sys.setrecursionlimit = setrecursionlimit
        out, err = sys.stdout, sys.stderr
        if STATUS_FD in keep:
            os.close(STATUS_FD)  # set up: from here on job code runs, which must not reach it
    except BaseException as e:  # noqa: BLE001 - report and die, never return into the server
        try:
            os.write(rep, f"X child setup failed: {e!r}\n".encode())
        finally:
            os._exit(70)

    def finish():
        for stream in (out, err):
            try:
                stream.flush()
            except _BaseException:
                pass
        _exit(0)

    try:
        if role == "tests":
            _test_program(job, finish)
        elif role == "solution":
            _solution_process(job, (out, err))
        else:
            _harness(job, finish)
    finally:
        _exit(0)


# ---------------------------------------------------------------- the server loop


def _count_own_processes():
    """Processes whose real uid is ours (RLIMIT_NPROC counts these, the new child excluded)."""
    uid = str(os.getuid())
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            n += line.split()[1] == uid
                            break
            except OSError:
                pass
    return n


def _clean_dirs():
    return (TMP_ROOT, "/dev/shm", "/dev/mqueue") if CONTAINED else (TMP_ROOT,)


def _forward_message(src, dst):
    """Move the next control message (4-byte length + body) from ``src`` to ``dst`` with
    ``splice`` (kernel to kernel: its bytes never enter this process's memory); a control
    channel that is not a pipe falls back to read/write.  Raises EOFError if ``src`` ends."""
    head = _read_exact(src, 4)
    if head is None:
        raise EOFError("control channel closed")
    n = struct.unpack(">I", head)[0]
    sink = dst
    while n:
        try:
            k = os.splice(src, sink, n)
        except OSError as e:
            if e.errno == 32 and sink == dst:  # EPIPE: the reader died; keep the stream in step
                sink = os.open("/dev/null", os.O_WRONLY)
                continue
            if e.errno not in (22, 95) and sink == dst:  # not EINVAL/EOPNOTSUPP: a real error
                raise
            data = os.read(src, min(n, 1 << 20))
            k = len(data)
            if sink == dst:
                try:
                    _write_all(dst, data)
                except OSError:
                    pass
        except AttributeError:  # no os.splice
            data = os.read(src, min(n, 1 << 20))
            k = len(data)
            _write_all(dst, data)
        if not k:
            raise EOFError("control channel closed")
        n -= k
    if sink != dst:
        os.close(sink)


class _Pipes:
    """The run's stdout, stderr and report pipes, read into buffers bounded by their caps
    (``REPORT_CAP`` for the report, ``output_bytes`` for the others); ``total_out`` counts every
    stdout/stderr byte read, kept or not.  ``poller`` also watches the children's pidfds."""

    def __init__(self, out_r, err_r, rep_r, cap):
        self.out_r, self.err_r, self.rep_r, self.cap = out_r, err_r, rep_r, cap
        self.bufs = {out_r: bytearray(), err_r: bytearray(), rep_r: bytearray()}
        self.total_out = 0
        self.poller = select.poll()
        self.open_fds = {out_r, err_r, rep_r}
        for fd in (out_r, err_r, rep_r):
            self.poller.register(fd, select.POLLIN)

    def read_some(self, fd):
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            self.poller.unregister(fd)
            self.open_fds.discard(fd)
            return
        buf = self.bufs[fd]
        limit = REPORT_CAP if fd == self.rep_r else self.cap
        if len(buf) < limit:
            buf += data[: limit - len(buf)]
        if fd != self.rep_r:
            self.total_out += len(data)

    def drain(self, seconds):
        """Every writer is dead: read what is left in the pipes (bounded by the caps)."""
        drain_deadline = time.monotonic() + seconds
        while self.open_fds and time.monotonic() < drain_deadline:
            for fd, _ in self.poller.poll(100):
                if fd in self.open_fds:
                    self.read_some(fd)


def run_job(job, ctl_in):
    """Run one job in fresh children; return the raw observations for the runner to judge.

    The job's second message (tests, tokens, imports) is read from ``ctl_in`` here: forwarded
    to the test program in ``tests`` mode, merged into ``job`` in ``code`` mode."""
    limits = job["limits"]
    oom0 = _limit_run(limits)
    stdin_fd = _stdin_fd(job)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rep_r, rep_w = os.pipe()
    status_r, status_w = os.pipe()
    pids_cg = CGROUP is not None and CGROUP["pids"] is not None
    nproc_base = None if pids_cg else _count_own_processes()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    pid, solution = _start_children(job, ctl_in, limits, nproc_base, stdin_fd, out_w, err_w,
                                    rep_w, status_w)
    for fd in (stdin_fd, out_w, err_w, rep_w, status_w):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    pipes = _Pipes(out_r, err_r, rep_r, limits["output_bytes"])
    pipes.poller.register(pidfd, select.POLLIN)
    if solution is not None:
        pipes.poller.register(solution[1], select.POLLIN)
    status, solution_status, timeout, output_limit = _watch_run(
        pid, pidfd, solution, pipes, t0 + limits["wall_s"])
    wall = time.monotonic() - t0
    if solution is not None and solution_status is None and not (timeout or output_limit):
        solution_status = _solution_end(solution)
    clean = _kill_everything(CONTAINED)
    if status is None:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
    pipes.drain(1.0)
    setup_error = _read_status(status_r)
    for fd in (out_r, err_r, rep_r, pidfd, status_r):
        os.close(fd)
    if solution is not None:
        os.close(solution[1])
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    clean = _clean_after_run(clean)
    oom_kills = _cg_oom_kills() - oom0 if CGROUP is not None else 0
    exited = status is not None and os.WIFEXITED(status)
    b64 = lambda b: base64.b64encode(bytes(b)).decode()  # noqa: E731
    return {
        "stdout": b64(pipes.bufs[out_r]),
        "stderr": b64(pipes.bufs[err_r]),
        "report": b64(pipes.bufs[rep_r]),
        "setup_error": setup_error,
        "exit_code": os.WEXITSTATUS(status) if exited else None,
        # the test program's signal, else the one that ended the solution's process early
        # (SIGXCPU: its CPU limit) while the test program waited for it
        "signal": (os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else
                   os.WTERMSIG(solution_status) if solution_status is not None
                   and os.WIFSIGNALED(solution_status) else None),
        "timeout": timeout,
        "output_limit": output_limit or pipes.total_out > pipes.cap,
        "wall_s": wall,
        "cpu_s": cpu,
        "clean": clean,
        "oom_kill": oom_kills > 0,
    }


def _read_status(fd):
    """A child's setup failure from the status pipe (every write end is closed by now: the
    children closed theirs or are dead), or None; at most 4 KiB, never blocks."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    return data.decode("utf-8", "replace").strip() or None


def _limit_run(limits):
    """The whole run (all its processes, its /tmp files, kernel memory) within memory_mb and
    max_procs, when the server has a cgroup; returns the cgroup's OOM-kill count so far."""
    oom0 = 0
    if CGROUP is not None:
        _cg_write(CGROUP["mem"], str(int(limits["memory_mb"]) << 20))
        if CGROUP["pids"] is not None:
            _cg_write(CGROUP["pids"], str(int(limits["max_procs"])))
        oom0 = _cg_oom_kills()
    return oom0


def _stdin_fd(job):
    """A descriptor reading the job's stdin from its start (a memfd), or /dev/null."""
    if job.get("stdin"):
        stdin_fd = os.memfd_create("stdin")
        data = job["stdin"].encode()
        while data:
            data = data[os.write(stdin_fd, data):]
        os.lseek(stdin_fd, 0, os.SEEK_SET)
    else:
        stdin_fd = os.open("/dev/null", os.O_RDONLY)
    return stdin_fd


def _start_children(job, ctl_in, limits, nproc_base, stdin_fd, out_w, err_w, rep_w, status_w):
    """Fork the run's children; return the pid of the one whose end ends the run (the test
    program, or the only child) and (pid, pidfd) of the solution's process in a split run
    (else None).  Every child gets ``status_w`` as STATUS_FD for its setup failure."""
    if not (job["mode"] == "tests" and job.get("split", True)):
        job.update(_recv(ctl_in) or {})
        pid = os.fork()
        if pid == 0:
            _child(job, (stdin_fd, out_w, err_w, {REPORT_FD: rep_w, STATUS_FD: status_w}),
                   limits, nproc_base)
        return pid, None
    # the solution's process first (it loads the solution meanwhile), then the test
    # program; the tests and tokens then go from the runner's pipe into the test program's
    # without passing through this process (C, forked from it, never has them in memory)
    tests_r, tests_w = os.pipe()
    call_r, call_w = os.pipe()
    ans_r, ans_w = os.pipe()
    cpid = os.fork()
    if cpid == 0:
        _child(job, (stdin_fd, out_w, err_w, {CALL_FD: call_r, ANSWER_FD: ans_w,
                                             STATUS_FD: status_w}),
               limits, nproc_base, "solution")
    null = os.open("/dev/null", os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        _child(job, (null, out_w, err_w, {REPORT_FD: rep_w, TESTS_FD: tests_r,
                                          CALL_FD: call_w, ANSWER_FD: ans_r,
                                          STATUS_FD: status_w}),
               limits, nproc_base, "tests")
    for fd in (null, tests_r, call_r, call_w, ans_r, ans_w):
        os.close(fd)
    try:
        _forward_message(ctl_in, tests_w)
    finally:
        os.close(tests_w)
    return pid, (cpid, os.pidfd_open(cpid))


def _watch_run(pid, pidfd, solution, pipes, deadline):
    """Read the pipes until the child ``pid`` ends, the wall-time ``deadline`` passes or the
    output exceeds its cap.  Returns (status, solution_status, timeout, output_limit): the
    wait statuses (None: still running) of the child and of the solution's process."""
    poller = pipes.poller
    status = solution_status = None
    timeout = output_limit = False
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            timeout = True
            break
        for fd, _ in poller.poll(max(1, min(int(left * 1000), 1 << 30))):
            if fd == pidfd:
                _, status = os.waitpid(pid, 0)
                poller.unregister(pidfd)
            elif solution is not None and fd == solution[1]:
                _, solution_status = os.waitpid(solution[0], 0)
                poller.unregister(fd)
            else:
                pipes.read_some(fd)
        if pipes.total_out > pipes.cap:
            output_limit = True
            break
    return status, solution_status, timeout, output_limit


def _solution_end(solution):
    """The test program has ended, so the solution's process reads end-of-file and exits now,
    or has just been ended by a signal (its CPU limit) that made the test program stop: wait a
    moment for its status rather than mistake it for our own kill.  None if it did not end."""
    waiter = select.poll()
    waiter.register(solution[1], select.POLLIN)
    if waiter.poll(50):
        _, solution_status = os.waitpid(solution[0], 0)
        return solution_status
    return None


def _clean_after_run(clean):
    """Nothing of the run may reach the next one: files (any depth, inodes), POSIX queues,
    SysV IPC, keys.  What cannot be removed makes the run unclean (returns False; else
    ``clean``): the runner restarts the sandbox, and its namespaces (tmpfs, IPC, keyrings) die
    with it."""
    wipe_deadline = time.monotonic() + WIPE_S
    for d in _clean_dirs():
        clean = _wipe(d, wipe_deadline) and clean
    if CONTAINED:
        _remove_sysv_ipc()
        _clear_keyrings()
    return clean


def main():
    global CONTAINED, TMP_ROOT, CGROUP
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    CONTAINED = bool(config.get("contained"))
    TMP_ROOT = config.get("tmp", "/tmp")
    CGROUP = config.get("cgroup")
    # Pid 1 of a PID namespace receives from inside it only the signals it has handlers for;
    # ignore every catchable one (SIGINT's KeyboardInterrupt killed the server) and join a
    # fresh session keyring (the trainer's is not ours to share)
    _ignore_signals()
    _new_session_keyring()
    ctl_in = os.dup(0)
    ctl_out = os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    # Nobody else with our uid may ptrace us or read /proc/<us>/{mem,fd}: the solution runs as
    # the same uid, so this keeps it out of the server and its control pipes.
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - optional modules
            pass
    _send(ctl_out, {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "python": sys.version,
                     "prefix": sys.prefix})
    while True:
        job = _recv(ctl_in)
        if job is None:
            return
        try:
            result = run_job(job, ctl_in)
        except Exception as e:  # noqa: BLE001 - report server faults to the runner
            result = {"server_error": f"{type(e).__name__}: {e}"}
        _send(ctl_out, result)


if __name__ == "__main__":
    main()
