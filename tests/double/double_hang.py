"""TEST DOUBLE of a hung SGLang scheduler, switched on by SIGUSR1 (tests only).

Loaded last by the server double (sglang_server_double.py) with:

    import double_hang  # pylint: disable=import-outside-toplevel
    handler = double_hang.install(handler, double)

After the process receives SIGUSR1, the generation path stops answering: GET /health_generate
and POST /generate accept the connection and then never respond (the request just waits), as
users see a scheduler that hangs with the process alive. Everything else keeps answering; in
particular GET /health still returns 200, so a check of /health alone misses the hang, and
/metrics, /server_info keep answering.

This is the switch issue 15 defines for the double. Real SGLang 0.5.9 behaves differently in one
respect: its /health also runs a 1-token generation (like /health_generate), so a real hung
scheduler fails /health too after SGLANG_HEALTH_CHECK_TIMEOUT; only /ping stays 200. The
watchdog probes /health_generate, which fails in both.

There is no switch back: restarting the process (what the watchdog does) ends the hang.
"""

import signal
import sys
import threading

_HUNG_PATHS = {"GET": ("/health_generate",), "POST": ("/generate",)}


def install(handler_class, double):
    """Arm SIGUSR1 and make the generation path hang once it arrived."""
    hung = threading.Event()
    double.hung = hung

    def on_sigusr1(_signum, _frame):
        hung.set()
        sys.stderr.write("double: SIGUSR1 received; /health_generate and /generate hang from now on\n")

    signal.signal(signal.SIGUSR1, on_sigusr1)

    def hanging(method, base):
        def handle(self):
            if hung.is_set() and self.path.split("?", 1)[0] in _HUNG_PATHS[method]:
                threading.Event().wait()  # forever; the server's threads are daemons
                return
            base(self)

        return handle

    handler_class.do_GET = hanging("GET", handler_class.do_GET)
    handler_class.do_POST = hanging("POST", handler_class.do_POST)
    return handler_class
