"""Refuse a model source URL that holds a credential, on the controller, before any module on the
node is given it: a module's arguments are logged to the node's journal as it starts, so a
refusal by the sglang_model module would come too late for the journal. This is the one place of
the rule: the module does not check the URL again.

model_source_problems(models) takes the sglang_models role's list of models (each with source,
label and headers_var) and returns one refusal per problem, naming the variable and never quoting
the URL. Unit-tested in tests/unit/test_model_logic.py.
"""

from urllib.parse import urlsplit


def url_problems(url, variable, credentials_var):
    """Refusals of a source URL, naming ``variable``; never quoting the URL, which may hold a secret.

    A user name or password (https://user:token@host) would be written wherever the URL is
    recorded, so it is refused with a pointer to ``credentials_var``; a query or fragment too (a
    signed query is a credential as well, and file paths are appended to the URL's path).
    """
    try:
        parts = urlsplit(url)
        parts.port  # pylint: disable=pointless-statement  # raises ValueError for a port out of range
    except ValueError as exc:
        return ["%s: expected an http:// or https:// URL, it does not parse (%s)" % (variable, exc)]
    problems = []
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.append("%s: expected an http:// or https:// URL with a host" % variable)
    if parts.username is not None or parts.password is not None:
        problems.append("%s holds a credential (a user name or password before the host, user:password@): the URL "
                        "is recorded on the node (the model folder's .sglang-model.json, production_v2.md, the "
                        "journal), so give it without one and put the credential in %s (from ansible-vault, "
                        "never recorded), e.g. {Authorization: Basic BASE64(user:password)}" % (variable, credentials_var))
    if parts.query or parts.fragment:
        problems.append("%s: expected a base URL without a query or fragment (each file's path is appended to it, "
                        "and a signed query is a credential that would be recorded on the node); put a credential "
                        "in %s" % (variable, credentials_var))
    return problems


def source_problems(spec, label, headers_var, token_var):
    """Refusals of a source's URLs (an http source's url, an hf source's endpoint), before any fetch."""
    spec = spec or {}
    if spec.get("type") == "http" and spec.get("url"):
        return url_problems(str(spec["url"]), label + ".url", headers_var)
    if spec.get("type") == "hf" and spec.get("endpoint"):
        return url_problems(str(spec["endpoint"]), label + ".endpoint", token_var)
    return []


def model_source_problems(models):
    """Every refusal of the models' source URLs, in the order of the models."""
    problems = []
    for model in models:
        problems += source_problems(model.get("source"), model["label"], model["headers_var"], "sglang_models_hf_token")
    return problems


class FilterModule:
    """sglang-canon's model source filter."""

    def filters(self):
        return {"model_source_problems": model_source_problems}
