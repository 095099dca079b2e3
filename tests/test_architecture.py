"""The package's shape: subpackages by role, each importing only what its
`__init__` docstring's "May import:" line declares; no cycle; command lines
only at the top; a short top level. And the tests' shape: folders that mirror the
subpackages, and no test module importing another (shared fixtures and helpers
live in tests/conftest.py).

Edges come from every `import` in the source, function-level ones included, so a
lazy import cannot hide a dependency.
"""

import ast
import collections
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "lealla_tf"
MAX_TOP_LEVEL_MODULES = 10


def modules():
    """{dotted name under lealla_tf ('' for the package): path}."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph():
    found = modules()
    edges = collections.defaultdict(set)
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if target.startswith("lealla_tf."):
                    target = target[len("lealla_tf."):]
                    if target in found and target != name:
                        edges[name].add(target)
    return found, edges


def unit(name: str) -> str:
    """The layer a module belongs to: its subpackage, or itself at the top."""
    return name.split(".")[0]


def declared_imports() -> dict:
    """{unit: set of units it may import, or None for anything} from the
    "May import:" line of each subpackage's __init__ and top-level module."""
    found = modules()
    units = {unit(n) for n in found if n}
    declared = {}
    for name in sorted(units):
        docstring = ast.get_docstring(ast.parse(found[name].read_text())) or ""
        match = re.search(r"^May import: (.*?)(?:\n\n|\Z)", docstring, re.S | re.M)
        assert match, f"lealla_tf.{name}'s docstring has no 'May import:' line"
        text = " ".join(match.group(1).split())
        if text.startswith("anything in lealla_tf"):
            allowed = set(units) - {name}
            for excluded in re.findall(r"lealla_tf\.(\w+)", text):
                allowed.discard(excluded)
        elif text.startswith("nothing else"):
            allowed = set()
        else:
            allowed = set(re.findall(r"lealla_tf\.(\w+)", text))
            unknown = allowed - units
            assert not unknown, f"lealla_tf.{name} declares unknown units {unknown}"
        declared[name] = allowed
    return declared


def test_every_unit_declares_what_it_may_import():
    declared = declared_imports()
    assert {"models", "tokenizers", "train", "inference", "evaluation", "recipe",
            "cli"} <= set(declared)


def test_imports_follow_the_declared_layers():
    _, edges = import_graph()
    declared = declared_imports()
    undeclared = sorted(
        f"lealla_tf.{a} -> lealla_tf.{b}" for a, targets in edges.items() for b in targets
        if a and unit(a) != unit(b) and unit(b) not in declared[unit(a)]
        and not a.endswith("__main__"))  # `python -m` entry points call their command line
    assert not undeclared, ("imports that the importer's 'May import:' line does not "
                            f"declare: {undeclared}")


def test_the_declared_layers_have_no_cycle():
    """Declarations form an order: no unit may import one that may import it."""
    declared = declared_imports()
    state = {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(declared[node]):
            if state.get(target) == "open":
                raise AssertionError("declared cycle: " + " -> ".join(path + [node, target]))
            if target not in state:
                visit(target, path + [node])
        state[node] = "done"

    for node in sorted(declared):
        if node not in state:
            visit(node, [])


def test_no_module_cycle():
    _, edges = import_graph()
    state = {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path + [node, target]))
            if target not in state:
                visit(target, path + [node])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_library_modules_never_import_a_command_line():
    _, edges = import_graph()
    offenders = sorted((a, b) for a, targets in edges.items() for b in targets
                       if unit(b) == "cli" and unit(a) != "cli" and not a.endswith("__main__"))
    assert not offenders, offenders


def test_the_top_level_stays_short():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_two_siblings_are_near_synonyms():
    """`train` / `training`, `evaluate` / `evaluation`, `vocab` / `vocabulary`:
    one name a role. Siblings may not share their first five letters, nor may
    one name be another's prefix."""
    for directory in [PACKAGE, *[p for p in PACKAGE.rglob("*") if p.is_dir()]]:
        if directory.name == "__pycache__":
            continue
        names = sorted({p.stem for p in directory.iterdir()
                        if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
                        and not p.stem.startswith("__")})
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                assert not (b.startswith(a) or a[:5] == b[:5]), (
                    f"{directory.relative_to(PACKAGE.parent)}: {a} and {b}")


def files_under_tests():
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_test_folders_mirror_the_subpackages():
    """tests/<subpackage>/ holds the tests of lealla_tf/<subpackage>/; helpers/ holds
    scripts the tests run. No __init__.py: pytest imports test files by basename
    (prepend mode), so a basename may appear once in the whole tree."""
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - {"helpers"} <= subpackages, folders - {"helpers"} - subpackages
    assert not [p for p in files_under_tests() if p.name == "__init__.py"]
    names = collections.Counter(p.name for p in files_under_tests() if p.name != "conftest.py")
    assert not [name for name, count in names.items() if count > 1], names.most_common(3)


def test_no_test_module_imports_another():
    """A test module's fixtures and helpers that another module needs go to
    tests/conftest.py (fixtures there reach every folder; plain helpers are imported
    `from conftest import ...`), so no test file depends on where another one is."""
    offenders = []
    for path in files_under_tests():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(TESTS.parent)}:{node.lineno} imports {name}"
                          for name in names if name.split(".")[0].startswith("test_")]
    assert not offenders, offenders
