"""ABI check of pjrt_plugin._c_api against the real PJRT C headers (0.112).

``pjrt_struct_sizes.json`` next to this file is the compiler's view of the
headers: sizeof/alignof/NAME_STRUCT_SIZE and field offsets of every struct,
the offset of every PJRT_Api entry, enum values and version macros.  It is
produced by compiling a throwaway probe with gcc, never by hand::

    python tests/pjrt_abi/test_pjrt_struct_sizes.py --regen DIR

DIR must contain pjrt_c_api.h, pjrt_c_api_shardings_extension.h and
pjrt_c_api_layouts_extension.h.  The list of structs, API entries and enums
is taken from the headers; field names come from our module (a misspelt
field makes the probe fail to compile).  Structs without a
PJRT_DEFINE_STRUCT_TRAITS line get ``"struct_size": null``.
"""

import ctypes
import json
import pathlib
import re
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # run as a script (--regen): find the package
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import pytest

from pjrt_plugin import _c_api as capi

JSON_PATH = pathlib.Path(__file__).with_name("pjrt_struct_sizes.json")
HEADER_FILES = (
    "pjrt_c_api.h",
    "pjrt_c_api_shardings_extension.h",
    "pjrt_c_api_layouts_extension.h",
)
# Header structs we deliberately leave out of _c_api (none at present).
NOT_DEFINED: frozenset[str] = frozenset()


def _field_names(cls):
    """Field names as C sees them (anonymous unions flattened)."""
    anon = set(getattr(cls, "_anonymous_", ()))
    names = []
    for f in cls._fields_:
        if f[0] in anon:
            names += [m[0] for m in f[1]._fields_]
        else:
            names.append(f[0])
    return names


# --------------------------------------------------------------- the tests

TRUTH = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}
STRUCTS = TRUTH.get("structs", {})


def test_every_header_struct_is_defined():
    ours = set(capi.STRUCT_SIZE)
    header = set(STRUCTS) - NOT_DEFINED
    assert sorted(header - ours) == []  # missing in _c_api
    assert sorted(ours - header) == []  # not in the header
    # Header order is kept too.
    assert [c.__name__ for c in capi.STRUCTS] == [
        n for n in STRUCTS if n not in NOT_DEFINED]


@pytest.mark.parametrize("name", sorted(set(STRUCTS) - NOT_DEFINED))
def test_struct_layout(name):
    cls = getattr(capi, name)
    want = STRUCTS[name]
    assert ctypes.sizeof(cls) == want["size"]
    assert ctypes.alignment(cls) == want["align"]
    if want["struct_size"] is not None:
        assert capi.struct_size(cls) == want["struct_size"]
        assert capi.STRUCT_SIZE[name] == want["struct_size"]
        assert cls.STRUCT_SIZE == want["struct_size"]
    got = {f: getattr(cls, f).offset for f in _field_names(cls)}
    assert got == want["offsets"]


def test_api_table_order_and_offsets():
    offsets = TRUTH["PJRT_Api_offsets"]
    assert list(capi.API_ENTRY_POINTS) == list(offsets)
    for name, off in offsets.items():
        assert getattr(capi.PJRT_Api, name).offset == off, name
    assert ctypes.sizeof(capi.PJRT_Api) == STRUCTS["PJRT_Api"]["size"]
    assert capi.PJRT_Api.STRUCT_SIZE == STRUCTS["PJRT_Api"]["struct_size"]


def test_entry_point_types():
    ext = (capi.SHARDINGS_EXTENSION_ENTRY_POINTS
           + capi.LAYOUTS_EXTENSION_ENTRY_POINTS)
    names = capi.API_ENTRY_POINTS + ext
    assert set(capi.ENTRY_FUNCTYPE) == set(names)
    assert set(capi.ARGS_STRUCT) == set(names)
    void = {"PJRT_Error_Destroy", "PJRT_Error_Message"}
    for name in names:
        ft = capi.ENTRY_FUNCTYPE[name]
        assert getattr(capi, name) is ft
        assert capi.ARGS_STRUCT[name].__name__ == name + "_Args"
        assert ft._argtypes_ == (ctypes.POINTER(capi.ARGS_STRUCT[name]),)
        want = None if name in void else ctypes.c_void_p
        assert ft._restype_ is want, name
    for name in capi.API_ENTRY_POINTS:
        ft = capi.ENTRY_FUNCTYPE[name]
        assert capi.field_type(capi.PJRT_Api, name) is ft
    for ext_cls, ext_names in (
            (capi.PJRT_Shardings_Extension,
             capi.SHARDINGS_EXTENSION_ENTRY_POINTS),
            (capi.PJRT_Layouts_Extension,
             capi.LAYOUTS_EXTENSION_ENTRY_POINTS)):
        assert [f[0] for f in ext_cls._fields_] == ["base", *ext_names]


def test_enum_values():
    enums = TRUTH["enums"]
    for cname, value in enums.items():
        assert getattr(capi, cname) == value, cname
    # No IntEnum member that the header does not have.
    members = [m for obj in vars(capi).values()
               if isinstance(obj, type) and issubclass(obj, capi.IntEnum)
               and obj is not capi.IntEnum for m in obj]
    assert len(members) == len(enums)


def test_version_macros():
    for name, value in TRUTH["macros"].items():
        assert getattr(capi, name) == value, name
    assert (capi.PJRT_API_MAJOR, capi.PJRT_API_MINOR) == (0, 112)


def test_imports_alone_without_jax():
    """The ctypes definitions import on their own (no JAX needed to check a header)."""
    code = ("import sys, pjrt_plugin._c_api as c; "
            "print(c.struct_size(c.PJRT_Api) > 0, 'jax' in sys.modules)")
    root = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


# ----------------------------------------------------------- regeneration


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _scan_headers(hdir):
    structs, with_size, api, enums, macros = [], set(), [], [], []
    for fname in HEADER_FILES:
        text = _strip_comments((hdir / fname).read_text())
        structs += re.findall(r"\bstruct\s+(PJRT_\w+)\s*\{", text)
        with_size.update(re.findall(
            r"PJRT_DEFINE_STRUCT_TRAITS\(\s*(PJRT_\w+)\s*,", text))
        with_size.update(re.findall(r"\b(PJRT_\w+)_STRUCT_SIZE\s*=", text))
        api += [n for n in re.findall(
            r"_PJRT_API_STRUCT_FIELD\(\s*(\w+)\s*\)", text) if n != "fn_type"]
        for body in re.findall(r"typedef\s+enum\s*\{(.*?)\}", text, re.S):
            enums += [e.split("=")[0].strip() for e in body.split(",")
                      if e.strip()]
        macros += re.findall(r"#define\s+(PJRT_API_\w+)\s+\d+", text)
    return structs, with_size, api, enums, macros


def _probe_source(structs, with_size, api, enums, macros):
    out = ["#include <stdio.h>", "#include <stddef.h>"]
    out += [f'#include "xla/pjrt/c/{f}"' for f in HEADER_FILES]
    out += ["int main(void) {"]
    for s in structs:
        ss = f"(long){s}_STRUCT_SIZE" if s in with_size else "-1L"
        out.append(f'  printf("S {s} %ld %ld %ld\\n", (long)sizeof({s}), '
                   f"(long)_Alignof({s}), {ss});")
        cls = getattr(capi, s, None)
        for f in _field_names(cls) if cls is not None else ():
            out.append(f'  printf("F {s} {f} %ld\\n", '
                       f"(long)offsetof({s}, {f}));")
    for a in api:
        out.append(f'  printf("A {a} %ld\\n", (long)offsetof(PJRT_Api, {a}));')
    for e in enums:
        out.append(f'  printf("E {e} %ld\\n", (long){e});')
    for m in macros:
        out.append(f'  printf("D {m} %ld\\n", (long){m});')
    out += ["  return 0;", "}", ""]
    return "\n".join(out)


def regenerate(hdir, cc="gcc"):
    hdir = pathlib.Path(hdir)
    scan = _scan_headers(hdir)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        inc = tmp / "inc" / "xla" / "pjrt" / "c"
        inc.mkdir(parents=True)
        for f in HEADER_FILES:
            (inc / f).write_bytes((hdir / f).read_bytes())
        (tmp / "probe.c").write_text(_probe_source(*scan))
        subprocess.run([cc, "-std=c11", "-Wall", "-I", str(tmp / "inc"),
                        str(tmp / "probe.c"), "-o", str(tmp / "probe")],
                       check=True)
        lines = subprocess.run([str(tmp / "probe")], check=True,
                               capture_output=True, text=True).stdout
    data = {"pjrt_api_version": None, "structs": {}, "PJRT_Api_offsets": {},
            "enums": {}, "macros": {}}
    for line in lines.splitlines():
        kind, *rest = line.split()
        if kind == "S":
            name, size, align, ss = rest
            data["structs"][name] = {
                "size": int(size), "align": int(align),
                "struct_size": None if int(ss) < 0 else int(ss),
                "offsets": {}}
        elif kind == "F":
            data["structs"][rest[0]]["offsets"][rest[1]] = int(rest[2])
        elif kind == "A":
            data["PJRT_Api_offsets"][rest[0]] = int(rest[1])
        elif kind == "E":
            data["enums"][rest[0]] = int(rest[1])
        elif kind == "D":
            data["macros"][rest[0]] = int(rest[1])
    m = data["macros"]
    data["pjrt_api_version"] = [m["PJRT_API_MAJOR"], m["PJRT_API_MINOR"]]
    JSON_PATH.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {JSON_PATH}: {len(data['structs'])} structs, "
          f"{len(data['PJRT_Api_offsets'])} API entries")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regen", metavar="DIR", required=True,
                    help="directory holding the three PJRT headers")
    ap.add_argument("--cc", default="gcc")
    args = ap.parse_args()
    regenerate(args.regen, args.cc)
