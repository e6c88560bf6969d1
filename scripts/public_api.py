#!/usr/bin/env python3
"""Prints the public API of a crate from its rustdoc JSON, one sorted line
per item: paths, signatures, fields, variants, trait items and impls.

Usage: public_api.py target/doc/<crate>.json

The listing is meant to be diffed in review (see scripts/public-api.sh), so
it favours stable, readable lines over completeness: auto-trait and blanket
impls are left out, and items re-exported from another crate appear as
their `pub use` line (that crate's own listing has the details).
"""
import json
import sys


def main(path):
    doc = json.load(open(path))
    index = doc["index"]
    lines = set()

    def item(i):
        return index.get(str(i))

    def ty(t):
        if t is None:
            return "()"
        if isinstance(t, str):
            return t
        (kind, v), = t.items()
        if kind == "resolved_path":
            return path_(v)
        if kind == "primitive" or kind == "generic":
            return v
        if kind == "borrowed_ref":
            lt = (v["lifetime"] + " ") if v.get("lifetime") else ""
            return "&" + lt + ("mut " if v["is_mutable"] else "") + ty(v["type"])
        if kind == "raw_pointer":
            return "*" + ("mut " if v["is_mutable"] else "const ") + ty(v["type"])
        if kind == "tuple":
            return "(" + ", ".join(ty(x) for x in v) + ")"
        if kind == "slice":
            return "[" + ty(v) + "]"
        if kind == "array":
            return "[" + ty(v["type"]) + "; " + v["len"] + "]"
        if kind == "impl_trait":
            return "impl " + bounds(v)
        if kind == "dyn_trait":
            parts = [poly(p) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if kind == "qualified_path":
            trait = path_(v["trait"]) if v.get("trait") else ""
            return "<" + ty(v["self_type"]) + (" as " + trait if trait else "") + ">::" + v["name"]
        if kind == "function_pointer":
            sig = v["sig"]
            return "fn(" + ", ".join(ty(x[1]) for x in sig["inputs"]) + ")" + ret(sig.get("output"))
        return kind

    def args(a):
        if not a:
            return ""
        if "angle_bracketed" in a:
            ab = a["angle_bracketed"]
            parts = []
            for g in ab["args"]:
                (k, x), = g.items() if isinstance(g, dict) else (("x", g),)
                parts.append(ty(x) if k == "type" else (x if isinstance(x, str) else json.dumps(x)))
            for c in ab.get("constraints", []):
                b = c["binding"]
                parts.append(c["name"] + (" = " + ty(b["equality"]["type"]) if "equality" in b and "type" in b["equality"] else ": " + bounds(b.get("constraint", []))))
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in a:
            p = a["parenthesized"]
            return "(" + ", ".join(ty(x) for x in p["inputs"]) + ")" + ret(p.get("output"))
        return ""

    def path_(p):
        return p["path"] + args(p.get("args"))

    def poly(p):
        return path_(p["trait"])

    def bound(b):
        (k, v), = b.items()
        if k == "trait_bound":
            m = {"maybe": "?", "maybe_const": "~const "}.get(v.get("modifier"), "")
            return m + path_(v["trait"])
        if k == "outlives":
            return v
        return k

    def bounds(bs):
        return " + ".join(bound(b) for b in bs)

    def ret(o):
        return "" if o is None else " -> " + ty(o)

    def generics(g):
        params = []
        for p in g.get("params", []):
            (k, v), = p["kind"].items()
            if k == "type":
                if v.get("is_synthetic"):
                    continue
                params.append(p["name"] + (": " + bounds(v["bounds"]) if v["bounds"] else ""))
            elif k == "lifetime":
                params.append(p["name"])
            elif k == "const":
                params.append("const " + p["name"] + ": " + ty(v["type"]))
        preds = []
        for w in g.get("where_predicates", []):
            if "bound_predicate" in w:
                b = w["bound_predicate"]
                preds.append(ty(b["type"]) + ": " + bounds(b["bounds"]))
        out = "<" + ", ".join(params) + ">" if params else ""
        return out, (" where " + ", ".join(preds) if preds else "")

    def fn(name, f):
        h = f["header"]
        q = ("const " if h["is_const"] else "") + ("async " if h["is_async"] else "") + ("unsafe " if h["is_unsafe"] else "")
        g, w = generics(f["generics"])
        ins = ", ".join("self" if n == "self" and False else (n + ": " + ty(t)) for n, t in f["sig"]["inputs"])
        return q + "fn " + name + g + "(" + ins + ")" + ret(f["sig"].get("output")) + w

    def public(it):
        return it.get("visibility") == "public"

    seen = set()

    def walk(mod_id, prefix):
        if mod_id in seen:
            return
        seen.add(mod_id)
        m = item(mod_id)["inner"]["module"]
        for cid in m["items"]:
            it = item(cid)
            if it is None or not public(it):
                continue
            emit(it, prefix)

    def emit(it, prefix):
        (kind, v), = it["inner"].items()
        name = it.get("name")
        here = prefix + "::" + name if name else prefix
        if kind == "module":
            lines.add("pub mod " + here)
            walk(it["id"], here)
        elif kind == "use":
            target = item(v["id"]) if v.get("id") is not None else None
            if v["is_glob"]:
                if target and "module" in target["inner"]:
                    seen.discard(target["id"])
                    walk(target["id"], prefix)
                else:
                    lines.add("pub use " + prefix + "::" + v["source"] + "::*")
            elif target is not None:
                renamed = dict(target)
                renamed["name"] = v["name"]
                emit(renamed, prefix)
            else:
                lines.add("pub use " + prefix + "::" + v["name"] + " = " + v["source"])
        elif kind == "function":
            lines.add("pub " + fn(here, v))
        elif kind == "constant":
            lines.add("pub const " + here + ": " + ty(v["type"]))
        elif kind == "static":
            lines.add("pub static " + here + ": " + ty(v["type"]))
        elif kind == "type_alias":
            g, _ = generics(v["generics"])
            lines.add("pub type " + here + g + " = " + ty(v["type"]))
        elif kind == "macro":
            lines.add("pub macro " + here + "!")
        elif kind in ("struct", "enum", "union"):
            g, w = generics(v["generics"])
            attrs = " ".join(a for a in map(str, it.get("attrs", [])) if "non_exhaustive" in a)
            lines.add(("#[non_exhaustive] " if attrs else "") + "pub " + kind + " " + here + g + w)
            if kind == "struct":
                sk = v["kind"]
                if isinstance(sk, dict) and "plain" in sk:
                    for fid in sk["plain"]["fields"]:
                        f = item(fid)
                        if f and public(f):
                            lines.add("pub " + here + "::" + f["name"] + ": " + ty(f["inner"]["struct_field"]))
                elif isinstance(sk, dict) and "tuple" in sk:
                    for n, fid in enumerate(sk["tuple"]):
                        f = item(fid) if fid is not None else None
                        if f and public(f):
                            lines.add("pub " + here + "::" + str(n) + ": " + ty(f["inner"]["struct_field"]))
            if kind == "enum":
                for vid in v["variants"]:
                    var = item(vid)
                    vk = var["inner"]["variant"]["kind"]
                    shape = ""
                    if isinstance(vk, dict) and "tuple" in vk:
                        shape = "(" + ", ".join(ty(item(f)["inner"]["struct_field"]) if f is not None else "_" for f in vk["tuple"]) + ")"
                    elif isinstance(vk, dict) and "struct" in vk:
                        shape = " { " + ", ".join(item(f)["name"] + ": " + ty(item(f)["inner"]["struct_field"]) for f in vk["struct"]["fields"]) + " }"
                    lines.add("pub " + here + "::" + var["name"] + shape)
            for iid in v["impls"]:
                impl(item(iid), here)
        elif kind == "trait":
            g, w = generics(v["generics"])
            sup = (": " + bounds(v["bounds"])) if v["bounds"] else ""
            lines.add(("pub unsafe trait " if v["is_unsafe"] else "pub trait ") + here + g + sup + w)
            for tid in v["items"]:
                ti = item(tid)
                (tk, tv), = ti["inner"].items()
                sub = here + "::" + ti["name"]
                if tk == "function":
                    lines.add(fn(sub, tv) + (" { default }" if tv["has_body"] else ""))
                elif tk == "assoc_type":
                    lines.add("type " + sub + (": " + bounds(tv["bounds"]) if tv["bounds"] else ""))
                elif tk == "assoc_const":
                    lines.add("const " + sub + ": " + ty(tv["type"]))
        else:
            lines.add("pub " + kind + " " + here)

    def impl(it, owner):
        v = it["inner"]["impl"]
        if v["is_synthetic"] or v.get("blanket_impl") is not None:
            return
        g, w = generics(v["generics"])
        head = "impl" + g + " " + (("!" if v["is_negative"] else "") + path_(v["trait"]) + " for " if v["trait"] else "") + ty(v["for"]) + w
        if v["trait"]:
            lines.add(head)
            return
        for mid in v["items"]:
            m = item(mid)
            if m is None or not public(m):
                continue
            (mk, mv), = m["inner"].items()
            if mk == "function":
                lines.add("pub " + fn(owner + "::" + m["name"], mv))
            elif mk == "assoc_const":
                lines.add("pub const " + owner + "::" + m["name"] + ": " + ty(mv["type"]))

    root = item(doc["root"])
    lines.add("pub mod " + root["name"])
    walk(root["id"], root["name"])
    for line in sorted(lines):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
