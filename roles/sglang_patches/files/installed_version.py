"""Print the version of the distribution named by argv[1], as installed for this interpreter.

sglang_patches' preflight runs it as ``PYTHON -c SOURCE NAME`` (one round trip, nothing copied).
importlib.metadata finds the distribution without importing it: importing sglang pulls torch.
A missing distribution fails with PackageNotFoundError, which the preflight reports.
"""

import sys
from importlib import metadata

print(metadata.version(sys.argv[1]))
