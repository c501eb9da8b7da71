"""PostfixRelay: Debian's Postfix as a relay of a test's own, with the limits the test chooses (anvil's rates).

    a folder of its own ─ conf/ (main.cf, master.cf: one smtpd on 127.0.0.1:<free port>, nothing chrooted)
                        ─ queue/ (its queue, its sockets, pid/master.pid) · data/ · maillog
                        ─ mail/sink/new/ (every recipient @example.test, one Maildir)
    start(): postconf -c conf -e <settings>; postfix -c conf start; wait until the port accepts
    stop():  SIGTERM to the master's PID, wait until every process of this relay has ended, remove the folder

Never the machine's /etc/postfix and never a fixed port: two test runs on one machine each have their own
relay. Postfix starts as root (it drops to the `postfix` user); it delivers to the Maildir as `nobody`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from email.parser import BytesHeaderParser
from pathlib import Path

from tests.support import until

POSTFIX = Path("/usr/sbin/postfix")
POSTCONF = Path("/usr/sbin/postconf")
DOMAIN = "example.test"
# the services this relay runs, none chrooted; the first line is the smtpd, on a port chosen at start
_SERVICES = """\
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
proxymap  unix  -       -       n       -       -       proxymap
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
virtual   unix  -       n       n       -       -       virtual
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


def missing() -> str | None:
    """Why this machine cannot run the relay, or None."""
    if not POSTFIX.exists() or not POSTCONF.exists():
        return f"{POSTFIX} is missing: install Debian's postfix with `make system-packages`"
    if os.geteuid() != 0:
        return "postfix starts as root only (it drops to its own user): run the tests as root"
    return None


class PostfixRelay:
    def __init__(self, limits: dict[str, str]) -> None:
        self.limits = limits
        self.folder = Path(tempfile.mkdtemp(prefix="outbox-postfix-"))  # short: its sockets live under it
        self.folder.chmod(0o755)  # postfix's own user reads its queue, `nobody` writes the Maildir
        self.port = _free_port()
        self.master_pid: int | None = None

    @property
    def conf(self) -> Path:
        return self.folder / "conf"

    @property
    def maildir(self) -> Path:
        return self.folder / "mail" / "sink"

    @property
    def maillog(self) -> Path:
        return self.folder / "maillog"

    def start(self) -> PostfixRelay:
        nobody = pwd.getpwnam("nobody")
        for name in ("conf", "queue", "data", "mail"):
            (self.folder / name).mkdir()
        os.chown(self.folder / "data", pwd.getpwnam("postfix").pw_uid, -1)
        os.chown(self.folder / "mail", nobody.pw_uid, nobody.pw_gid)
        (self.conf / "master.cf").write_text(f"127.0.0.1:{self.port} inet n - n - - smtpd\n{_SERVICES}")
        (self.conf / "main.cf").write_text("")
        settings = {
            "compatibility_level": "3.6",
            "queue_directory": str(self.folder / "queue"),
            "data_directory": str(self.folder / "data"),
            "maillog_file_prefixes": str(self.folder),
            "maillog_file": str(self.maillog),
            "myhostname": "relay.example.test",
            "inet_interfaces": "loopback-only",
            "inet_protocols": "ipv4",
            "mynetworks": "127.0.0.0/8",
            "mydestination": "",
            "local_transport": "error:no local delivery",
            "virtual_mailbox_domains": DOMAIN,
            "virtual_mailbox_base": str(self.folder / "mail"),
            "virtual_mailbox_maps": "static:sink/",
            "virtual_uid_maps": f"static:{nobody.pw_uid}",
            "virtual_gid_maps": f"static:{nobody.pw_gid}",
            "smtpd_recipient_restrictions": "permit_mynetworks, reject",
            **self.limits,
        }
        _run(POSTCONF, "-c", str(self.conf), "-e", *(f"{name}={value}" for name, value in settings.items()))
        _run(POSTFIX, "-c", str(self.conf), "start")
        pid_file = self.folder / "queue" / "pid" / "master.pid"
        self.master_pid = int(pid_file.read_text().split()[0])
        until(lambda: _accepts(self.port), what="postfix to accept connections")
        return self

    def stop(self) -> None:
        """SIGTERM to the master (as `postfix stop` sends), then wait for every process of this relay: its
        daemons work in its queue folder, so they are the processes whose working directory is there."""
        try:
            if self.master_pid is not None and _alive(self.master_pid):
                os.kill(self.master_pid, signal.SIGTERM)
                until(lambda: not self._processes(), timeout=20, what="postfix's processes to end")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def message_ids(self) -> list[str]:
        """The Message-ID of every message in the Maildir, one per message (repeats kept)."""
        found = []
        for path in (self.maildir / "new").glob("*"):
            with path.open("rb") as message:
                found.append(str(BytesHeaderParser().parse(message).get("Message-ID", "")))
        return found

    def log(self) -> str:
        return self.maillog.read_text(errors="replace") if self.maillog.exists() else ""

    def _processes(self) -> list[int]:
        queue = str(self.folder / "queue")
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _alive(int(entry.name)):
                try:
                    if os.readlink(entry / "cwd").startswith(queue):
                        pids.append(int(entry.name))
                except OSError:
                    continue
        return pids


def _run(*args: object) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(str(args[0])).name} failed ({done.returncode}): {done.stderr.strip()[-500:]}")


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie nobody reaped has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
