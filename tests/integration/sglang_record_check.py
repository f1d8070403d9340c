"""Print "<path> <sha256 hex on disk> <sha256 hex in RECORD>" for each path of the sglang distribution given.

Run on a test node by tests/integration/test_sglang_patches.py, with the node's SGLang Python
(``PYTHON -c SOURCE PATH...``), to tell pristine files (the two hashes equal) from patched ones.
"""

import base64
import hashlib
import importlib.metadata as metadata
import sys

for entry in metadata.distribution("sglang").files:
    if str(entry) in sys.argv[1:]:
        print(entry, hashlib.sha256(entry.locate().read_bytes()).hexdigest(),
              base64.urlsafe_b64decode(entry.hash.value + "==").hex())
