"""ds4d started the way systemd starts ds4d.service from ds4d.socket.

systemd binds and listens on the socket itself, then execs the service with the socket as
fd 3, LISTEN_FDS=1 and LISTEN_PID=<the service's pid>, NOTIFY_SOCKET naming a datagram
socket where a Type=notify service reports READY=1, and (StandardError=journal) stderr a
stream whose device:inode is in JOURNAL_STREAM. Checked here:
  - a client that connects before ds4d is ready is served once it is (the connection waits
    in the listen backlog: nothing is lost to the start-up);
  - READY=1 arrives on NOTIFY_SOCKET after the model is loaded, STOPPING=1 at shutdown;
  - log lines carry journal priorities (<6> info, <3> error) instead of time stamps;
  - ds4d leaves the socket file alone (it is systemd's) and exits 0 on SIGTERM;
  - a passed fd that is not a listening socket is refused with a clear error.
Usage: socket_activation_test.py DS4D DS4 DS4_MAKE_MODEL
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

ds4d, ds4_cli, make_model = sys.argv[1:4]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def start_activated(listen_fd, tmp, name, extra_env=None):
    """Execs ds4d with listen_fd as fd 3 and LISTEN_PID set to ds4d's own pid (the shell
    execs ds4d, so $$ is ds4d's pid), as systemd does after fork."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = os.path.join(tmp, name + ".notify")
    notify.bind(notify_path)
    err = open(os.path.join(tmp, name + ".log"), "wb")
    st = os.fstat(err.fileno())
    env = dict(os.environ)
    env.update({"LISTEN_FDS": "1", "NOTIFY_SOCKET": notify_path, "JOURNAL_STREAM": "%d:%d" % (st.st_dev, st.st_ino),
                "DS4_MODEL": os.path.join(tmp, "tiny.gguf")})
    env.pop("DS4_SOCKET", None)
    env.update(extra_env or {})
    p = subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', ds4d, "--no-store", "--backend", "cpu", "--threads", "1"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        pass_fds=(3,), preexec_fn=lambda: os.dup2(listen_fd, 3))
    return p, notify, err.name


def notifications(notify, until, timeout):
    got = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        notify.settimeout(max(0.01, deadline - time.time()))
        try:
            msg = notify.recv(4096).decode()
        except socket.timeout:
            break
        got.append(msg)
        if until in msg:
            break
    return got


with tempfile.TemporaryDirectory(prefix="ds4-sd-") as tmp:
    subprocess.run([make_model, "--preset", "tiny", "--quiet", os.path.join(tmp, "tiny.gguf")], check=True)
    path = os.path.join(tmp, "ds4.sock")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(16)
    os.chmod(path, 0o600)

    p, notify, log = start_activated(lsock.fileno(), tmp, "ok")
    # The first client connects right away, before ds4d can have loaded anything.
    client = subprocess.Popen([ds4_cli, "--socket", path, "tokenize", "hello"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    msgs = notifications(notify, "READY=1", 120)
    check(any("READY=1" in m for m in msgs), "no READY=1 on NOTIFY_SOCKET (got %r)" % msgs)
    out, err = client.communicate(timeout=120)
    check(client.returncode == 0 and out.strip(), "early client was not served: rc %s, %r %r" % (
        client.returncode, out, err))
    r = subprocess.run([ds4_cli, "--socket", path, "run", "--raw", "--max-tokens", "4", "x"], capture_output=True,
                       timeout=120)
    check(r.returncode == 0, "ds4 run on the activated socket: %r" % r.stderr)
    p.terminate()
    check(p.wait(timeout=60) == 0, "ds4d did not exit 0 on SIGTERM")
    msgs = notifications(notify, "STOPPING=1", 5)
    check(any("STOPPING=1" in m for m in msgs), "no STOPPING=1 (got %r)" % msgs)
    check(os.path.exists(path), "ds4d removed systemd's socket file")
    text = open(log, encoding="utf-8", errors="replace").read()
    lines = [l for l in text.splitlines() if l]
    check(lines and all(l.startswith("<") and l[1] in "0123456789" and l[2] == ">" for l in lines),
          "log lines without journal priority prefixes:\n" + text)
    check(any(l.startswith("<6>") and "socket activation" in l for l in lines), "no <6> socket activation line:\n" + text)
    notify.close()

    # A passed fd that is not a listening socket: a clear error at <3>, exit 1.
    rfd, wfd = os.pipe()
    p, notify, log = start_activated(rfd, tmp, "bad")
    rc = p.wait(timeout=60)
    text = open(log, encoding="utf-8", errors="replace").read()
    check(rc == 1, "ds4d with a pipe as fd 3 exited %s" % rc)
    check("<3>" in text and "fd 3" in text, "no <3> error naming fd 3:\n" + text)
    notify.close()

    # systemd's own tool for the same protocol, where installed (Debian: package systemd).
    import shutil
    sa = shutil.which("systemd-socket-activate")
    if sa:
        path2 = os.path.join(tmp, "sa.sock")
        log2 = open(os.path.join(tmp, "sa.log"), "wb")
        p = subprocess.Popen([sa, "-l", path2, "-E", "DS4_MODEL=" + os.path.join(tmp, "tiny.gguf"), ds4d, "--no-store",
                              "--backend", "cpu", "--threads", "1"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=log2)
        deadline = time.time() + 30
        while not os.path.exists(path2) and time.time() < deadline:
            time.sleep(0.01)
        r = subprocess.run([ds4_cli, "--socket", path2, "tokenize", "hello"], capture_output=True, timeout=120)
        check(r.returncode == 0 and r.stdout.strip(), "systemd-socket-activate: client not served: %r" % r.stderr)
        p.terminate()
        check(p.wait(timeout=60) == 0, "ds4d under systemd-socket-activate did not exit 0")
        text = open(log2.name, encoding="utf-8", errors="replace").read()
        check("socket activation: serving " + path2 in text, "ds4d did not take the passed socket:\n" + text)
    else:
        print("systemd-socket-activate not installed: that part skipped")

print("socket activation:", "FAILED" if failures else "ok")
sys.exit(1 if failures else 0)
