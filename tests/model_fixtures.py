"""Synthetic models and the model mirror double, for the model tests (roles and integration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from project_modules import REPO

DOUBLE = REPO / "tests" / "double"


def make_models(parser_python, out: Path, variant="good"):
    """Write target/ and draft/ under ``out`` with make_test_models.py; returns name -> manifest."""
    done = subprocess.run([str(parser_python), str(DOUBLE / "make_test_models.py"), str(out), "--variant", variant],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


class MirrorProcess:
    """tests/double/model_mirror.py serving ``root`` on ``bind``; requests are read from its log."""

    def __init__(self, root: Path, log: Path, bind="127.0.0.1", cuts=(), double="model_mirror.py", options=()):
        self.log = log
        command = [sys.executable, str(DOUBLE / double), str(root), "--bind", bind, "--port", "0",
                   "--log", str(log), *options]
        for path, count in cuts:
            command += ["--cut", "%s:%d" % (path, count)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # pylint: disable=consider-using-with
        line = self.process.stdout.readline()
        assert line.startswith("listening on "), line
        self.url = "http://%s:%s" % (bind, line.split()[-1])

    def requests(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    @classmethod
    def hub(cls, root: Path, log: Path, repo, commit, token, bind="127.0.0.1"):
        """tests/double/hf_hub_double.py serving ``root`` as ``repo`` at ``commit``, asking for ``token``."""
        return cls(root, log, bind=bind, double="hf_hub_double.py",
                   options=("--repo", repo, "--commit", commit, "--token", token))

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)
        self.process.stdout.close()


def tiny_tokenizer(vocab_size=1024):
    """tokenizer.json + tokenizer_config.json of a WordLevel tokenizer (words w3..w<vocab-1>),
    the vocabulary size of the test node's config.json; loads with transformers'
    AutoTokenizer offline, which is all bench_serving's random-ids dataset needs."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, vocab_size)})
    special = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
                 "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 2048, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": json.dumps(tokenizer), "tokenizer_config.json": json.dumps(config)}
