"""Every module in library/ documents itself: ansible-doc parses DOCUMENTATION/EXAMPLES/RETURN, the documented
options are exactly the argument_spec's with the same type, default, choices and required flag, and check mode
is declared."""

from __future__ import annotations

import pytest
import yaml

# the helpers live in tests/unit/library_docs.py; test_options.py still imports two of them from here
from library_docs import MODULES, REPO, _argument_spec, ansible_doc, module_docs, module_kwargs  # noqa: F401


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_parses_and_options_match(name):
    doc = ansible_doc().get(name)
    assert doc, f"ansible-doc rendered no documentation for library/{name}.py"
    assert doc["doc"]["short_description"] and doc["examples"] and doc["return"] is not None
    yaml.safe_load(doc["examples"])
    options = doc["doc"].get("options") or {}
    spec = _argument_spec(REPO / "library" / f"{name}.py")
    assert set(options) == set(spec), f"documented {sorted(options)} vs argument_spec {sorted(spec)}"
    for opt, s in spec.items():
        d = options[opt]
        want = (s.get("type", "str"), s.get("default"), s.get("choices"), bool(s.get("required")))
        got = (d.get("type", "str"), d.get("default"), d.get("choices"), bool(d.get("required")))
        assert want == got, f"{name}.{opt}: argument_spec {want} vs DOCUMENTATION {got}"
    assert module_kwargs(REPO / "library" / f"{name}.py").get("supports_check_mode") is True, name
