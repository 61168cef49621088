"""What an operator meets: the version (te.__version__, te_version(),
te-bench -version agree), metrics in Prometheus's text format, settings from
the environment refused by name when they do not parse, TE_LOG_LEVEL, and
the Mooncake drop-in before initialize."""

import logging
import os
import re
import subprocess
import sys
import textwrap
import unittest

import te
from mooncake.engine import TransferEngine

INSTALLED = os.environ.get("TE_TEST_INSTALLED") == "1"


def run_python(code, env):
    """Runs code in a fresh interpreter (libte takes its environment when it
    loads), with env added to this one's."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=120)


class VersionTest(unittest.TestCase):
    def test_version_strings_agree(self):
        v = te.__version__
        major, minor = te.abi_version()
        self.assertTrue(v.startswith(f"{major}.{minor}.0"), v)
        if INSTALLED or os.path.exists(os.path.join(os.path.dirname(te.__file__), "_version.py")):
            # The wheel's te/_version.py and its libte.so were stamped by
            # one build.
            self.assertEqual(te.version(), v)
        else:
            # A source checkout: mk/version.sh is the one source, as for
            # libte.so and te-sidecar that make built from it (make exports
            # TE_VERSION, which mk/version.sh then repeats).
            root = os.path.join(os.path.dirname(os.path.abspath(te.__file__)), "..", "..")
            script = os.path.join(root, "mk", "version.sh")
            want = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30, check=True).stdout.strip()
            self.assertEqual(v, want)
            self.assertNotIn("+dev", v)
            if os.environ.get("TE_VERSION"):
                self.assertEqual(te.version(), v)
            else:
                self.assertTrue(te.version().startswith(f"{major}.{minor}.0"), te.version())
        bench = os.environ.get("TE_BENCH")
        if not bench:
            self.skipTest("TE_BENCH (te-bench of the same build) not set")
        out = subprocess.run([bench, "-version"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), f"te-bench {te.version()}")


class SourceCheckoutVersionTest(unittest.TestCase):
    def test_source_checkout_says_what_mk_version_says(self):
        """te imported from python/ of a checkout reports mk/version.sh's
        version, the one make stamps into libte.so, te-sidecar and the
        wheel, not a "+dev" of its own."""
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
        script = os.path.join(root, "mk", "version.sh")
        if not os.path.isfile(script):
            self.skipTest("not run from a source checkout")
        want = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        out = subprocess.run([sys.executable, "-c", "import te; print(te.__version__)"], cwd=root,
                             env=dict(os.environ, PYTHONPATH=os.path.join(root, "python")),
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), want)


class MetricsTest(unittest.TestCase):
    def test_metrics_exposition(self):
        with te.Engine(listen_addr="127.0.0.1:0") as e:
            buf = bytearray(1 << 16)
            addr = e.register(buf)
            seg = e.open_segment(e.name)
            e.write(seg, addr, addr + (1 << 15), 1 << 15)
            seg.close()
            text = e.metrics()
        self.assertIn('te_tasks_total{state="completed"} 1\n', text)
        self.assertIn('te_task_duration_seconds_count{transport="local",peer="same_process"} 1\n', text)
        self.assertIn('te_batch_stage_seconds_count{transport="local",stage="transfer"} ', text)
        helped, typed, families = set(), set(), set()
        for line in text.splitlines():
            if line.startswith("# HELP "):
                helped.add(line.split()[2])
            elif line.startswith("# TYPE "):
                typed.add(line.split()[2])
            elif line:
                name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
                families.add(re.sub(r"_(bucket|sum|count)$", "", name) if name.startswith(
                    ("te_task_duration_seconds", "te_batch_stage_seconds")) else name)
        self.assertTrue(families)
        self.assertEqual(families - helped, set())
        self.assertEqual(families - typed, set())


class EnvTest(unittest.TestCase):
    def test_bad_values_refused_by_name(self):
        code = """
            import te
            try:
                te.Engine(listen_addr="127.0.0.1:0")
            except te.InvalidArgument as e:
                print("refused:", e)
            else:
                print("accepted")
        """
        for name, value in [("TE_ACCEPT_MOONCAKE_PEERS", "maybe"), ("TE_MAX_CONNS", "lots"),
                            ("TE_LOG_LEVEL", "chatty"), ("TE_PARAM_tcp_conn", "4"), ("TE_TCP_LISTEN", "nowhere")]:
            out = run_python(code, {name: value})
            self.assertIn("refused:", out.stdout, out.stderr)
            self.assertIn(name, out.stdout)

    def test_env_read_at_engine_creation(self):
        # Set after the library loaded (here: after a first engine), a
        # variable still reaches the next engine.
        code = """
            import os, te
            te.Engine(listen_addr="127.0.0.1:0").close()
            os.environ["TE_MAX_CONNS"] = "lots"
            try:
                te.Engine(listen_addr="127.0.0.1:0")
                print("accepted")
            except te.InvalidArgument as e:
                print("refused:", e)
            del os.environ["TE_MAX_CONNS"]
            te.Engine(listen_addr="127.0.0.1:0").close()
            print("ok")
        """
        out = run_python(code, {})
        self.assertIn('refused: new: invalid argument: TE_MAX_CONNS="lots"', out.stdout, out.stderr)
        self.assertIn("ok", out.stdout, out.stderr)

    def test_dropin_refuses_by_name(self):
        code = """
            import logging
            logging.basicConfig(level=logging.ERROR)
            from mooncake.engine import TransferEngine
            print("rc", TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
        """
        for name, value in [("MC_FORCE_TCP", "banana"), ("MC_TRANSFER_TIMEOUT", "soon"),
                            ("TE_ACCEPT_MOONCAKE_PEERS", "maybe"), ("TE_ALLOW_MOONCAKE_WITH_SECRET", "perhaps")]:
            out = run_python(code, {name: value})
            self.assertIn(f"rc {-te.InvalidArgument.code}", out.stdout, out.stderr)
            self.assertIn(name, out.stderr)

    def test_dropin_reaches_every_setting(self):
        # A secret plus Mooncake peers: refused naming the variable that
        # allows it, and accepted once it is set.
        code = """
            import logging
            logging.basicConfig(level=logging.ERROR)
            from mooncake.engine import TransferEngine
            e = TransferEngine()
            print("rc", e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
            if e.get_engine() is not None:
                import json
                print("tcp", e.get_engine().stats().get("transports"))
        """
        env = {"TE_AUTH_SECRET": "drop-in-test-secret-0123", "TE_ACCEPT_MOONCAKE_PEERS": "1"}
        out = run_python(code, env)
        self.assertIn(f"rc {-te.InvalidArgument.code}", out.stdout, out.stderr)
        self.assertIn("TE_ALLOW_MOONCAKE_WITH_SECRET=1", out.stderr)
        out = run_python(code, dict(env, TE_ALLOW_MOONCAKE_WITH_SECRET="1", TE_PARAM_tcp_conns="2"))
        self.assertIn("rc 0", out.stdout, out.stderr)

    def test_log_level(self):
        code = """
            import logging, te
            print(logging.getLogger("mooncake.engine").getEffectiveLevel(), logging.getLogger("te").level)
            with te.Engine(listen_addr="127.0.0.1:0") as e:
                e.open_segment(e.name).close()
        """
        out = run_python(code, {"TE_LOG_LEVEL": "debug", "TE_LOG_FORMAT": "json"})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), [str(logging.DEBUG), str(logging.DEBUG)])
        # The library's own lines: JSON, debug level, a segment open.
        self.assertRegex(out.stderr, r'\{"time":"[^"]+","level":"DEBUG","msg":"te: segment opened"')
        out = run_python(code, {"TE_LOG_LEVEL": "error"})
        self.assertNotIn("segment opened", out.stderr)
        self.assertNotIn("no cluster secret", out.stderr)  # a warning: below error


class DropInBeforeInitializeTest(unittest.TestCase):
    def test_calls_before_initialize(self):
        e = TransferEngine()
        with self.assertLogs("mooncake.engine", logging.ERROR) as cm:
            self.assertEqual(e.get_rpc_port(), -te.InvalidArgument.code)
            self.assertEqual(e.register_memory(4096, 4096), -te.InvalidArgument.code)
            self.assertEqual(e.transfer_sync_write("127.0.0.1:1", 4096, 4096, 1), -te.InvalidArgument.code)
            self.assertEqual(e.allocate_managed_buffer(4096), 0)
        self.assertTrue(all("initialize" in line for line in cm.output), cm.output)
        self.assertIsNone(e.get_engine())
        e.close()  # nothing to close: no error


if __name__ == "__main__":
    unittest.main()
