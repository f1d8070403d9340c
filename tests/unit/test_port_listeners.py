"""Parsing of /proc/net/tcp{,6} and /proc/PID/cgroup by the sglang_port_listeners module."""

import pytest


@pytest.fixture(scope="module")
def listeners(project_module):
    return project_module("library/sglang_port_listeners.py")


# Real /proc/net/tcp lines: a listener on 127.0.0.1:30000 (0x7530), one on 0.0.0.0:22,
# and an established connection to port 30000 that must not count.
PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 41234 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 17021 1 0000000000000000 100 0 0 10 0
   2: 0100007F:9C40 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 51000 1 0000000000000000 20 4 30 10 -1
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6001 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6002 1 0000000000000000 100 0 0 10 0
"""


def test_ipv4_listener_on_the_port_only(listeners):
    assert listeners.parse_proc_net_tcp(PROC_NET_TCP, 30000) == [("127.0.0.1", 41234)]
    assert listeners.parse_proc_net_tcp(PROC_NET_TCP, 22) == [("0.0.0.0", 17021)]
    assert listeners.parse_proc_net_tcp(PROC_NET_TCP, 8080) == []


def test_ipv6_listeners_including_v4_mapped(listeners):
    assert listeners.parse_proc_net_tcp(PROC_NET_TCP6, 30000) == [
        ("0000:0000:0000:0000:0000:0000:0000:0000", 6001),
        ("::ffff:127.0.0.1", 6002),
    ]


def test_unit_of_a_service_process_on_unified_and_hybrid_cgroups(listeners):
    assert listeners.unit_of("0::/system.slice/sglang.service\n") == "sglang.service"
    hybrid = "12:pids:/system.slice/ssh.service\n1:name=systemd:/system.slice/ssh.service\n0::/system.slice/ssh.service\n"
    assert listeners.unit_of(hybrid) == "ssh.service"
    assert listeners.unit_of("0::/user.slice/user-0.slice/session-3.scope\n") == "session-3.scope"
    assert listeners.unit_of("0::/\n") is None


def test_a_port_held_by_another_program_is_refused_naming_each_one_and_the_owner_is_not(listeners):
    held = [
        {"address": "127.0.0.1", "port": 30000, "pid": 812, "command": "python3", "unit": "sglang.service"},
        {"address": "::", "port": 30000, "pid": 9, "command": "nc", "unit": None},
        {"address": "::", "port": 30000, "pid": 10, "command": "squat", "unit": "squat.service"},
    ]
    assert listeners.refusal("sglang_server_args.port", 30000, held[:1], "sglang.service") is None
    assert listeners.refusal("sglang_server_args.port", 30000, [], "sglang.service") is None
    assert listeners.refusal("sglang_server_args.port", 30000, held, "sglang.service") == (
        "sglang_server_args.port: 30000 is already taken by nc (pid 9, unit none), squat (pid 10, unit squat.service)"
    )
