"""The local cluster's tasks: loopback-only networking, and no task outliving its launcher.

TF's gRPC server listens on every interface (`grpc_server_lib.cc` binds
`0.0.0.0:<port>`; no option changes it) and runs any graph a client sends it.
So the launcher gives its tasks a network of their own (Linux): a holder process
unshares a user and a network namespace (unprivileged where the kernel allows
user namespaces), brings its loopback up and waits; each task enters both before
it execs the script, and can reach nothing but the other tasks.  Each task (and
the holder) also asks the kernel to kill it when the launcher dies
(`PR_SET_PDEATHSIG`), so a launcher killed by SIGKILL leaves no task behind.

Run as `python -m tpu_fc.local_network hold` (the holder) or `python -m
tpu_fc.local_network enter PARENT_PID NAMESPACE_PID|- -- COMMAND...` (a task);
`holder()` and `task_command()` build those for the launcher.
"""
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_READY = b'ready\n'


def _libc_call(name, *args):
  libc = ctypes.CDLL(None, use_errno=True)
  if getattr(libc, name)(*args) != 0:
    error = ctypes.get_errno()
    raise OSError(error, '{}: {}'.format(name, os.strerror(error)))


def _die_with_parent(parent_pid):
  """SIGKILL when the parent dies; exits now if it already has."""
  _libc_call('prctl', _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
  if os.getppid() != parent_pid:
    os._exit(1)  # pylint: disable=protected-access


def _write(path, text):
  with open(path, 'w') as f:
    f.write(text)


def _bring_loopback_up():
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    request = struct.pack('16sH22x', b'lo', 0)
    flags = struct.unpack('16sH22x', fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack('16sH22x', b'lo',
                                                   flags | _IFF_UP))


def _hold(parent_pid):
  """Creates the namespaces, says `ready`, and holds them until stdin closes."""
  uid, gid = os.getuid(), os.getgid()
  _libc_call('unshare', _CLONE_NEWUSER | _CLONE_NEWNET)
  _write('/proc/self/setgroups', 'deny')
  _write('/proc/self/uid_map', '0 {} 1'.format(uid))
  _write('/proc/self/gid_map', '0 {} 1'.format(gid))
  _bring_loopback_up()
  _die_with_parent(parent_pid)
  sys.stdout.buffer.write(_READY)
  sys.stdout.flush()
  sys.stdin.buffer.read()  # until the launcher closes it, or dies


def _enter(parent_pid, namespace_pid, command):
  if namespace_pid != '-':
    for kind, flag in (('user', _CLONE_NEWUSER), ('net', _CLONE_NEWNET)):
      descriptor = os.open('/proc/{}/ns/{}'.format(namespace_pid, kind),
                           os.O_RDONLY)
      _libc_call('setns', descriptor, flag)
      os.close(descriptor)
  _die_with_parent(parent_pid)
  os.execvp(command[0], command)


class Holder:
  """The process holding the tasks' namespaces; `pid` is None without them."""

  def __init__(self, process, pid, reason):
    self._process, self.pid, self.reason = process, pid, reason

  def stop(self):
    if self._process is not None:
      self._process.stdin.close()
      self._process.wait()
      self._process = None


def holder():
  """Starts the holder; a `Holder` whose `reason` says why not, where it fails."""
  process = subprocess.Popen(
      [sys.executable, '-m', 'tpu_fc.local_network', 'hold', str(os.getpid())],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  if process.stdout.readline() == _READY:
    return Holder(process, process.pid, None)
  process.stdin.close()
  reason = process.stderr.read().decode(errors='replace').strip().splitlines()
  process.wait()
  return Holder(None, None, reason[-1] if reason else 'no reason given')


def task_command(command, namespace_pid=None):
  """`command`, run in the holder's namespaces (if any) and killed with us."""
  return [sys.executable, '-m', 'tpu_fc.local_network', 'enter',
          str(os.getpid()), str(namespace_pid or '-'), '--'] + list(command)


def main(argv):
  if argv[:1] == ['hold'] and len(argv) == 2:
    _hold(int(argv[1]))
  elif argv[:1] == ['enter'] and argv[3:4] == ['--']:
    _enter(int(argv[1]), argv[2], argv[4:])
  else:
    raise SystemExit('usage: python -m tpu_fc.local_network hold PARENT_PID | '
                     'enter PARENT_PID NAMESPACE_PID|- -- COMMAND...')


if __name__ == '__main__':
  main(sys.argv[1:])
