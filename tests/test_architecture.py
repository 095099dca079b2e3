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
import importlib
import inspect
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
    scripts the tests run, benchmarks/ the tests of benchmarks/. No __init__.py:
    pytest imports test files by basename (prepend mode), so a basename may
    appear once in the whole tree."""
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    others = {"helpers", "benchmarks"}
    assert folders - others <= subpackages, folders - others - subpackages
    assert not [p for p in files_under_tests() if p.name == "__init__.py"]
    names = collections.Counter(p.name for p in files_under_tests() if p.name != "conftest.py")
    assert not [name for name, count in names.items() if count > 1], names.most_common(3)


# Modules with a function or class but no behaviour a test of their own could
# check (none today); a module of constants only needs no test file.
NO_BEHAVIOUR = set()
# A command line whose module name is also a library module's: its tests are
# tests/cli/test_<name>_command.py (a test basename appears once in the tree).
COMMAND_TESTS = {"embed_corpus", "mine_bitext"}
MAX_MODULE_LINES = 450


def modules_with_behaviour():
    """Every module of the package that defines a function or a class."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py") or "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) for node in tree.body):
            yield path


def expected_test_file(module: pathlib.Path) -> pathlib.Path:
    """tests/<subpackage>/test_<module>.py (tests/test_<module>.py at the top level);
    a nested subpackage's modules are tested in its subpackage's folder."""
    relative = module.relative_to(PACKAGE)
    folder = TESTS / relative.parts[0] if len(relative.parts) > 1 else TESTS
    name = module.stem
    if relative.parts[0] == "cli" and name in COMMAND_TESTS:
        name += "_command"
    return folder / f"test_{name}.py"


def test_every_module_with_behaviour_has_its_test_file():
    missing = [f"{m.relative_to(PACKAGE.parent)}: {expected_test_file(m).name}"
               for m in modules_with_behaviour()
               if m.relative_to(PACKAGE).as_posix() not in NO_BEHAVIOUR
               and not expected_test_file(m).exists()]
    assert not missing, missing


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


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


# === Private Keras, keras-hub and TensorFlow APIs live in the named adapters ===

# The only modules that may read, write or override a private attribute of a Keras
# or keras-hub object; each checks that what it uses is there, and names the
# version and the attribute when a release renames one.
PRIVATE_API_ADAPTERS = {"models.keras_adapter", "models.transformer_adapter"}
# The only modules that may import TensorFlow's or tensorflow-text's implementation
# modules (`tensorflow.python...`, `tensorflow_text.python...`) or read
# `tf.__internal__`; it names each internal and checks it is there.
TENSORFLOW_ADAPTERS = {"tokenizers.tensorflow_adapter"}
# The libraries' implementation packages, which are not their API (TensorFlow's is
# `tf.*`, Keras' `keras.*`), and the API TensorFlow marks internal.
PRIVATE_PACKAGES = ("tensorflow.python", "tensorflow_text.python", "keras.src",
                    "keras_hub.src", "tf_keras.src")
PRIVATE_PACKAGE_PATH = re.compile(
    "(" + "|".join(re.escape(package) for package in PRIVATE_PACKAGES) + r")(\.\w+)*")
INTERNAL_ATTRIBUTES = ("__internal__",)
# Underscored names of other libraries that the package may use, and whose they are.
OTHER_PRIVATE_NAMES = {
    "_replace": "typing.NamedTuple's public API",
    "_asdict": "typing.NamedTuple's public API",
    "_fields": "typing.NamedTuple's public API",
    "_make": "typing.NamedTuple's public API",
    "_mmap": "numpy.memmap's mapping, closed to release a file",
}
PRIVATE_PATH = re.compile(r"_[A-Za-z]\w*(\._[A-Za-z]\w*)*")


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_private_names() -> set:
    """The underscored names lealla_tf defines outside the adapters: its functions,
    classes, variables, arguments, imports and the attributes it sets on `self`."""
    names = set()
    for name, path in modules().items():
        if name in PRIVATE_API_ADAPTERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return {name for name in names if is_private(name)}


def foreign_private_uses(tree, own: set) -> list:
    """(line, what) for each private attribute of an object lealla_tf does not
    define: read or written (`x._name`), or named in a string (`getattr(x,
    "_name")`, or an attribute path such as "_layer._name")."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if isinstance(node.ctx, ast.Store) and on_self:
                continue
            if node.attr not in own and node.attr not in OTHER_PRIVATE_NAMES:
                found.append((node.lineno, f".{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr")):
            names = [arg.value for arg in node.args[1:2]
                     if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            found += [(node.lineno, repr(name)) for name in names
                      if is_private(name) and name not in own
                      and name not in OTHER_PRIVATE_NAMES]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and PRIVATE_PATH.fullmatch(node.value) and "." in node.value):
            if any(part not in own and part not in OTHER_PRIVATE_NAMES
                   for part in node.value.split(".")):
                found.append((node.lineno, repr(node.value)))
    return found


def keras_subclass_modules() -> set:
    """Modules that define a class deriving (by its bases' names) from Keras or
    keras-hub, directly or through another such class of lealla_tf."""
    found = modules()
    classes, keras_names = [], collections.defaultdict(set)
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                    "keras", "keras_hub"):
                keras_names[name].update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.ClassDef):
                classes.append((name, node.name, [ast.unparse(b) for b in node.bases]))
    derived, changed = {}, True
    while changed:
        changed = False
        for module, cls, bases in classes:
            if cls in derived:
                continue
            if any(b.split(".")[0] in ("keras", "keras_hub") or b in keras_names[module]
                   or b.split(".")[-1] in derived for b in bases):
                derived[cls] = module
                changed = True
    return set(derived.values())


def test_no_private_keras_attribute_outside_the_adapters():
    """A private attribute of Keras or keras-hub changes without notice in a
    release. Only PRIVATE_API_ADAPTERS may use one (and they check it is there),
    so an upgrade breaks in one place, with words. Elsewhere in lealla_tf: no
    underscored attribute that lealla_tf does not define itself (read, written or
    named in a string), and no class that overrides a private Keras method."""
    own = own_private_names()
    offenders = []
    for name, path in sorted(modules().items()):
        if name in PRIVATE_API_ADAPTERS:
            continue
        offenders += [f"lealla_tf/{path.relative_to(PACKAGE)}:{line} uses {what}"
                      for line, what in foreign_private_uses(ast.parse(path.read_text()), own)]
    for name in sorted(keras_subclass_modules() - PRIVATE_API_ADAPTERS):
        module = importlib.import_module(f"lealla_tf.{name}" if name else "lealla_tf")
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            upstream = [base for base in cls.__mro__[1:]
                        if base.__module__.split(".")[0] in ("keras", "keras_hub")]
            offenders += [f"{module.__name__}.{cls.__name__} overrides {attribute}"
                          for attribute in vars(cls) if is_private(attribute)
                          and any(attribute in vars(base) for base in upstream)]
    assert not offenders, (
        "private Keras / keras-hub attributes outside "
        f"{sorted(PRIVATE_API_ADAPTERS)} (move the use into an adapter, or add a name "
        f"of another library to OTHER_PRIVATE_NAMES): {offenders}")


def private_package_uses(tree) -> list:
    """(line, what) for each import of a private package (`PRIVATE_PACKAGES`), each
    read of an attribute TensorFlow marks internal (`tf.__internal__`), and each
    private package named in a string (`importlib.import_module("tensorflow.python...")`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {alias.name}") for alias in node.names
                      if PRIVATE_PACKAGE_PATH.fullmatch(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if PRIVATE_PACKAGE_PATH.fullmatch(node.module):
                found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRIBUTES:
            found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and PRIVATE_PACKAGE_PATH.fullmatch(node.value)):
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_private_tensorflow_api_outside_the_adapters():
    """TensorFlow's `tensorflow.python`, tensorflow-text's `tensorflow_text.python`
    (and Keras' `keras.src`) are the libraries' implementation, and `tf.__internal__`
    is marked internal: any release may move what they hold. Only the adapters
    may use them, naming each internal and checking it is there, so an upgrade
    breaks in one place, with words."""
    adapters = PRIVATE_API_ADAPTERS | TENSORFLOW_ADAPTERS
    offenders = [f"lealla_tf/{path.relative_to(PACKAGE)}:{line} uses {what}"
                 for name, path in sorted(modules().items()) if name not in adapters
                 for line, what in private_package_uses(ast.parse(path.read_text()))]
    assert not offenders, (
        f"private TensorFlow / tensorflow-text / Keras APIs outside {sorted(adapters)} "
        f"(move the use into an adapter): {offenders}")


def test_the_private_api_check_sees_every_form():
    uses = private_package_uses(ast.parse(
        "import tensorflow.python.trackable\n"
        "from tensorflow_text.python.ops import bert_tokenizer\n"
        "from keras.src import backend\n"
        "root = tf.__internal__.tracking.AutoTrackable()\n"
        "ops = importlib.import_module('tensorflow.python.ops')\n"
        "import tensorflow, tensorflow_text\n"
        "from tensorflow.python_io import x\n"
        "text = 'see tensorflow.python for how'\n"))
    assert sorted(line for line, _ in uses) == [1, 2, 3, 4, 5]


def test_no_library_file_sends_readers_to_git_history():
    """Where a value came from (a retired benchmark's result at some commit) is
    docs/benchmarks.md's to say; library code names the benchmark, not a
    `git show <sha>:` of it."""
    pointers = [f"{path.relative_to(PACKAGE.parent)}:{number}"
                for path in sorted(PACKAGE.rglob("*")) if path.suffix in (".py", ".cc", ".h")
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(r"git\s+show", line)]
    assert not pointers, pointers
