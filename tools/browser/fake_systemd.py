"""A small stand-in for systemd as PID 1 of one `Type=notify` service with
an fd store, for tests that restart roomcastd outside a booted systemd.

What it does is what systemd 252 does for such a unit (sd_notify(3),
sd_pid_notify_with_fds(3), sd_listen_fds(3), systemd.service(5)):

- a `$NOTIFY_SOCKET` (an AF_UNIX datagram socket, SO_PASSCRED) read by a
  background thread; only the main PID's messages count (NotifyAccess=main,
  which FileDescriptorStoreMax= implies), anything else's descriptors are
  closed;
- `FDSTORE=1` keeps the attached descriptors under `FDNAME=` (default
  `stored`), at most `fdstore_max` (FileDescriptorStoreMax=; more are
  closed, as systemd does, silently for the sender), the same file only
  once; `FDSTOREREMOVE=1` closes every descriptor of that `FDNAME=`;
  `BARRIER=1` closes its descriptor once everything before it is handled;
  descriptors of any other message are closed; `READY=1` ends a start;
- a start passes the store to the next process as systemd does: the
  descriptors from fd 3 on, `LISTEN_FDS`, `LISTEN_FDNAMES` (colon-separated)
  and `LISTEN_PID` (the new process's own PID, set after the fork), plus
  `NOTIFY_SOCKET` and `FDSTORE` (the shipped units' Environment=FDSTORE=,
  systemd 252 not telling a service its store size);
- `restart()` is `systemctl restart`: SIGTERM, wait for the exit, handle
  every notification still queued (systemd reads its notify socket before
  it handles SIGCHLD), start the next process with the store; `stop()` is
  `systemctl stop`: the same, then the store is emptied (closed);
  `crash_restart()` is a SIGKILL followed by `Restart=on-failure`.

Not modelled: FDPOLL (systemd drops a stored descriptor that reports
EPOLLHUP/EPOLLERR unless FDPOLL=0 was sent; roomcastd sends FDPOLL=0 for
everything it stores), watchdog, socket units (no LISTEN_FDS of its own:
roomcastd binds its listeners and keeps them in the store), the order of
the store (systemd's is arbitrary; this one's is the order of arrival).
"""
import array
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

SCM_MAX_FD = 253
# Runs between fork and exec of the service, as systemd's own child code
# does: moves the passed descriptors to 3, 4, ... and sets LISTEN_PID to the
# PID that exec keeps. argv: n, the descriptors, then the command.
_EXEC_HELPER = r"""
import fcntl, os, sys
n = int(sys.argv[1]); fds = [int(a) for a in sys.argv[2:2 + n]]; command = sys.argv[2 + n:]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + n) for fd in fds]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i, inheritable=True)
    os.close(fd)
if n:
    os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(command[0], command)
"""


class ServiceError(Exception):
    pass


class FakeSystemd:
    """One service under a fake PID 1. `command`: the service's argv;
    `log_path`: its stdout and stderr (appended); `fdstore_max`: its
    FileDescriptorStoreMax= (0: no fd store, and no FDSTORE= either)."""

    def __init__(self, command, work_dir, log_path, fdstore_max=16, deadline_s=20):
        self.command = command
        self.log_path = log_path
        self.fdstore_max = fdstore_max
        self.deadline_s = deadline_s
        self.store = []          # [(name, fd)] in order of arrival
        self.messages = []       # [(pid, [lines])] of the main PID, for failure messages
        self.notes = []          # what PID 1 would log (store full, foreign senders)
        self.process = None
        self.ready_pid = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.path = os.path.join(work_dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setblocking(False)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # ------------------------------------------------------------ notifications

    def _read_loop(self):
        while not self._stopping.is_set():
            readable, _, _ = select.select([self.sock], [], [], 0.05)
            if readable:
                self.drain()

    def drain(self):
        """Handles every datagram queued on the notify socket now."""
        ancillary = socket.CMSG_SPACE(SCM_MAX_FD * 4) + socket.CMSG_SPACE(struct.calcsize("3i"))
        with self._lock:
            while True:
                try:
                    data, cmsgs, flags, _ = self.sock.recvmsg(4096, ancillary)
                except BlockingIOError:
                    return
                except OSError:
                    return  # closed by close()
                fds, pid = [], None
                for level, kind, payload in cmsgs:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        a = array.array("i")
                        a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                        fds.extend(a)
                    elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        pid = struct.unpack("3i", payload[:12])[0]
                if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
                    self.notes.append("a truncated notification from PID %s (flags %#x)" % (pid, flags))
                self._handle(pid, data.decode("utf-8", "replace").split("\n"), fds)

    def _handle(self, pid, lines, fds):
        main = self.process.pid if self.process is not None else None
        if pid is None or pid != main:
            self.notes.append("Got notification message from PID %s, but reception only permitted for main PID %s" % (pid, main))
            for fd in fds:
                os.close(fd)
            return
        lines = [line for line in lines if line]
        self.messages.append((pid, lines))
        values = dict(line.split("=", 1) for line in lines if "=" in line)
        name = values.get("FDNAME", "stored")
        if values.get("FDSTOREREMOVE") == "1":
            for n, fd in [e for e in self.store if e[0] == name]:
                os.close(fd)
            self.store = [e for e in self.store if e[0] != name]
        if values.get("FDSTORE") == "1" and fds:
            for fd in fds:
                if len(self.store) >= self.fdstore_max:
                    self.notes.append("Cannot store more fds than FileDescriptorStoreMax=%d, closing remaining" % self.fdstore_max)
                    os.close(fd)
                elif any(_same_file(fd, kept) for _, kept in self.store):
                    os.close(fd)
                else:
                    self.store.append((name, fd))
        else:
            # BARRIER=1's descriptor, or descriptors sent without FDSTORE=1:
            # closed once handled.
            for fd in fds:
                os.close(fd)
        if values.get("READY") == "1":
            self.ready_pid = pid

    # ------------------------------------------------------------ the service

    def start(self):
        """Starts the service with the store, and waits for its READY=1."""
        with self._lock:
            names = [n for n, _ in self.store]
            fds = [fd for _, fd in self.store]
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC",
                            "WATCHDOG_PID", "JOURNAL_STREAM", "FDSTORE")}
        env["NOTIFY_SOCKET"] = self.path
        if self.fdstore_max > 0:
            env["FDSTORE"] = str(self.fdstore_max)
        if fds:
            env["LISTEN_FDS"] = str(len(fds))
            env["LISTEN_FDNAMES"] = ":".join(names)
        log = open(self.log_path, "a")
        argv = [sys.executable, "-c", _EXEC_HELPER, str(len(fds))] + [str(fd) for fd in fds] + list(self.command)
        with self._lock:
            self.ready_pid = None
            self.process = subprocess.Popen(argv, env=env, pass_fds=fds, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        end = time.monotonic() + self.deadline_s
        while time.monotonic() < end:
            if self.ready_pid == self.process.pid:
                return
            if self.process.poll() is not None:
                self.drain()
                if self.ready_pid != self.process.pid:
                    raise ServiceError("the service exited with %d before READY=1:\n%s" % (self.process.returncode, self.log_tail()))
            time.sleep(0.01)
        raise ServiceError("no READY=1 within %d s:\n%s" % (self.deadline_s, self.log_tail()))

    def _terminate(self, sig):
        """Sends `sig`, waits for the exit and handles what the process sent before it."""
        self.process.send_signal(sig)
        try:
            status = self.process.wait(self.deadline_s)
        except subprocess.TimeoutExpired:
            # systemd: TimeoutStopSec= then SIGKILL.
            self.process.kill()
            self.process.wait()
            raise ServiceError("the service did not exit within %d s of %s:\n%s"
                               % (self.deadline_s, signal.Signals(sig).name, self.log_tail()))
        self.drain()
        return status

    def restart(self, while_stopped=None):
        """`systemctl restart`: SIGTERM, the exit, `while_stopped()` (no
        process of the service runs then), the next start with the store.
        Returns the old process's exit status."""
        status = self._terminate(signal.SIGTERM)
        if while_stopped is not None:
            while_stopped()
        self.start()
        return status

    def crash_restart(self, while_stopped=None):
        """A SIGKILL, then Restart=on-failure's start (the store is kept)."""
        self._terminate(signal.SIGKILL)
        if while_stopped is not None:
            while_stopped()
        self.start()

    def stop(self):
        """`systemctl stop`: SIGTERM, the exit, then the store is emptied
        (the last copy of each stored socket closes)."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self._terminate(signal.SIGTERM)
        finally:
            self._empty_store()

    def _empty_store(self):
        with self._lock:
            for _, fd in self.store:
                os.close(fd)
            self.store = []

    def stored_names(self):
        with self._lock:
            return [n for n, _ in self.store]

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def close(self):
        """Ends everything: the service (SIGKILL if SIGTERM is not enough), the store, the socket."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stopping.set()
        self._reader.join()
        self.drain()
        self._empty_store()
        self.sock.close()
        os.unlink(self.path)


def _same_file(a, b):
    """Whether two descriptors are the same open file, as systemd's
    same_fd() decides with kcmp(KCMP_FILE); inode and device stand in."""
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
