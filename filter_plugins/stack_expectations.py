"""Compare the sglang_stack fact (library/sglang_stack_facts.py) with the inventory's expectations.

sglang_stack_mismatches(stack, expectations, prefix) returns one line per expectation the stack
does not meet, each naming the expectation variable (prefix + key), what was expected and what
was found, so that the stack_verify role fails once, listing every mismatch.

Keys of `expectations` (an expectation that is None or "" is skipped):

  driver_cuda_min           driver's supported CUDA (nvidia-smi "CUDA Version") >= this
  torch_version             torch.__version__ matches: "2.9.1" matches "2.9.1" and "2.9.1+cu130";
                            "2.9.1+cu130" needs that local label too (PEP 440: case and - _ . alike)
  torch_cuda                torch built for this CUDA: torch.version.cuda matches ("13.0"). Checked on
                            its own: the +cu130 label is only a name the source gives the wheel, the
                            build is what torch itself reports (a relabelled or CPU build fails here)
  sglang_version            SGLang's distribution version, PEP 440 "==" ("0.5.9" matches "0.5.9" and
                            "0.5.9+local", not "0.5.9.post1"; a label given must match)
  cuda_available            torch.cuda.is_available() is this boolean
  device_count              torch.cuda.device_count() is this number
  compute_capability_min    every visible device's compute capability >= this ("12.0")
  nccl_version              NCCL's version matches ("2.27" matches 2.27.x)
  nvcc_release              nvcc's release matches ("13.0"); checked only where nvcc is installed
  python_version            the SGLang Python's version matches ("3.12" matches 3.12.3)

"matches" compares the dotted numbers component by component, the expectation being a prefix.
Pure Python (the controller's), unit-tested in tests/unit/test_stack_facts_parse.py.
"""

import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only outside Ansible
    AnsibleFilterError = ValueError

DEFAULT_PREFIX = "stack_verify_expected_"

KNOWN_KEYS = (
    "driver_cuda_min",
    "torch_version",
    "torch_cuda",
    "sglang_version",
    "cuda_available",
    "device_count",
    "compute_capability_min",
    "nccl_version",
    "nvcc_release",
    "python_version",
)

_TRUE = ("true", "yes", "y", "on", "1")
_FALSE = ("false", "no", "n", "off", "0")


def _numbers(value):
    """'13.0.88' -> (13, 0, 88); '2.9.1+cu130' -> (2, 9, 1); None/junk -> None."""
    if value is None:
        return None
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(value))
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def _padded(numbers, length):
    return tuple(numbers) + (0,) * (length - len(numbers))


def _at_least(found, minimum):
    length = max(len(found), len(minimum))
    return _padded(found, length) >= _padded(minimum, length)


def _prefix_match(found, expected):
    return tuple(found[: len(expected)]) == tuple(expected)


def _local_label(label):
    """PEP 440 normal form of a local version label: 'CU130' == 'cu130', 'rocm-6.4' == 'rocm.6.4'."""
    return re.sub(r"[-_.]", ".", label.strip().lower())


def _labels_match(want_local, found_local):
    """A wanted label must be the found one; no wanted label accepts any (PEP 440 '==')."""
    return not want_local or _local_label(want_local) == _local_label(found_local or "")


def _release_equal(want, found):
    """PEP 440 '==' on the public parts: '0.5.9' == '0.5.9.0', but not '0.5.9.post1' or '0.5.90'."""
    want_numbers, found_numbers = _numbers(want), _numbers(found)
    if want_numbers is None or found_numbers is None:
        return want.strip().lower() == found.strip().lower()
    rest = re.compile(r"^\s*v?\d+(?:\.\d+)*")
    length = max(len(want_numbers), len(found_numbers))
    return (_padded(want_numbers, length) == _padded(found_numbers, length)
            and rest.sub("", want).strip().lower() == rest.sub("", found).strip().lower())


def _skip(value):
    return value is None or (isinstance(value, str) and value.strip() == "")


def _section(stack, name):
    value = stack.get(name) if isinstance(stack, dict) else None
    return value if isinstance(value, dict) else {}


def _why(stack, *sections):
    """' (nvidia-smi not found ...)' from sglang_stack.errors, for a value found missing."""
    errors = _section(stack, "errors")
    reasons = [str(errors[s]) for s in sections if errors.get(s)]
    return " (%s)" % "; ".join(reasons) if reasons else ""


def _show(value):
    return "none" if value is None else str(value)


def _bool(name, value):
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in _TRUE:
        return True
    if str(value).strip().lower() in _FALSE:
        return False
    raise AnsibleFilterError("%s: expected true or false, got %r" % (name, value))


def _int(name, value):
    if isinstance(value, bool):
        raise AnsibleFilterError("%s: expected a number, got %r" % (name, value))
    try:
        return int(str(value).strip())
    except ValueError:
        raise AnsibleFilterError("%s: expected a number, got %r" % (name, value))


def _version(name, value):
    numbers = _numbers(value)
    if numbers is None:
        raise AnsibleFilterError("%s: expected a version like 13.0, got %r" % (name, value))
    return numbers


def sglang_stack_mismatches(stack, expectations, prefix=DEFAULT_PREFIX):
    """Every expectation the stack misses, as 'VARIABLE: expected X, found Y' lines (empty: all met)."""
    if not isinstance(expectations, dict):
        raise AnsibleFilterError("expectations must be a mapping, got %s" % type(expectations).__name__)
    unknown = sorted(set(expectations) - set(KNOWN_KEYS))
    if unknown:
        raise AnsibleFilterError("unknown expectation(s): %s (known: %s)" % (", ".join(unknown), ", ".join(KNOWN_KEYS)))
    stack = stack if isinstance(stack, dict) else {}
    driver = _section(stack, "driver")
    torch = _section(stack, "torch")
    nccl = _section(stack, "nccl")
    nvcc = _section(stack, "nvcc")
    sglang = _section(stack, "sglang")
    python = _section(stack, "python")
    out = []

    def miss(key, expected, found, why=""):
        out.append("%s%s: expected %s, found %s%s" % (prefix, key, expected, found, why))

    for key in KNOWN_KEYS:
        want = expectations.get(key)
        if _skip(want):
            continue
        name = prefix + key

        if key == "driver_cuda_min":
            minimum = _version(name, want)
            found = driver.get("cuda_version")
            numbers = _numbers(found)
            if numbers is None or not _at_least(numbers, minimum):
                miss(key, ">= %s (CUDA version the driver supports)" % want,
                     _show(found) + ("" if found is None else " (driver %s)" % _show(driver.get("driver_version"))),
                     _why(stack, "nvidia_smi") if found is None else "")

        elif key == "torch_version":
            found = torch.get("version")
            want_text = str(want).strip()
            want_public, _, want_local = want_text.partition("+")
            found_public, _, found_local = (found or "").partition("+")
            numbers = _numbers(found_public)
            ok = (found is not None and numbers is not None
                  and _prefix_match(numbers, _version(name, want_public))
                  and _labels_match(want_local, found_local))
            if not ok:
                miss(key, want_text, _show(found), _why(stack, "python", "torch") if found is None else "")

        elif key == "torch_cuda":
            want_numbers = _version(name, want)
            found = torch.get("cuda")
            if found is None or _numbers(found) is None or not _prefix_match(_numbers(found), want_numbers):
                if found is None and torch.get("version"):
                    shown = "none (torch %s is not a CUDA build)" % torch.get("version")
                elif found is not None:
                    shown = "%s (torch %s)" % (found, _show(torch.get("version")))
                else:
                    shown = _show(found) + _why(stack, "python", "torch")
                miss(key, "%s (torch.version.cuda, the CUDA torch was built for)" % want, shown)

        elif key == "sglang_version":
            found = sglang.get("version")
            want_public, _, want_local = str(want).strip().partition("+")
            found_public, _, found_local = str(found).strip().partition("+")
            if found is None or not (_release_equal(want_public, found_public)
                                     and _labels_match(want_local, found_local)):
                miss(key, str(want).strip(), _show(found), _why(stack, "python", "sglang") if found is None else "")

        elif key == "cuda_available":
            wanted = _bool(name, want)
            found = torch.get("cuda_available")
            if found is None or bool(found) != wanted:
                miss(key, str(wanted).lower(), _show(found if found is None else str(bool(found)).lower()),
                     _why(stack, "python", "torch", "cuda") if found is None or wanted else "")

        elif key == "device_count":
            wanted = _int(name, want)
            found = torch.get("device_count")
            if found is None or int(found) != wanted:
                miss(key, "%d CUDA device(s)" % wanted, _show(found), _why(stack, "python", "torch", "cuda"))

        elif key == "compute_capability_min":
            minimum = _version(name, want)
            capabilities = [c for c in (torch.get("compute_capabilities") or []) if c is not None]
            low = [c for c in capabilities if _numbers(c) is None or not _at_least(_numbers(c), minimum)]
            if not capabilities:
                miss(key, "every CUDA device >= %s" % want, "no CUDA device visible to torch",
                     _why(stack, "python", "torch", "cuda"))
            elif low:
                miss(key, "every CUDA device >= %s" % want, ", ".join(str(c) for c in capabilities))

        elif key == "nccl_version":
            want_numbers = _version(name, want)
            found = nccl.get("version")
            if found is None or _numbers(found) is None or not _prefix_match(_numbers(found), want_numbers):
                miss(key, str(want), _show(found), _why(stack, "python", "nccl") if found is None else "")

        elif key == "nvcc_release":
            want_numbers = _version(name, want)
            if not nvcc.get("path"):
                continue  # the toolkit is optional: checked only where installed
            found = nvcc.get("version") or nvcc.get("release")
            if found is None or _numbers(found) is None or not _prefix_match(_numbers(found), want_numbers):
                miss(key, "%s (nvcc at %s)" % (want, nvcc.get("path")), _show(found), _why(stack, "nvcc"))

        elif key == "python_version":
            want_numbers = _version(name, want)
            found = python.get("version")
            if found is None or _numbers(found) is None or not _prefix_match(_numbers(found), want_numbers):
                miss(key, str(want), _show(found), _why(stack, "python") if found is None else "")

    return out


class FilterModule:
    """sglang-canon's stack expectation filter."""

    def filters(self):
        return {"sglang_stack_mismatches": sglang_stack_mismatches}
