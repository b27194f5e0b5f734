#!/usr/bin/python3
"""Rebuilds a full state dict from the per-rank files of state_dict_type = "sharded"
(<run>/model-shards/rank-R-of-W.safetensors, metadata trainrun_pieces: name -> shape and offset of
the piece) and compares it with a full state dict (model.safetensors of the same run written with
state_dict_type = "full"): same names, every element covered exactly once, bitwise-equal values.
Standard library only.   usage: sharded_state_check.py SHARDS_DIR FULL_FILE
"""
import array, glob, json, math, struct, sys


def read(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, v in header.items():
        assert v["dtype"] == "F32", f"{path}: {name} is {v['dtype']}"
        b, e = v["data_offsets"]
        a = array.array("f")
        a.frombytes(blob[8 + n + b:8 + n + e])
        out[name] = a
    return meta, out


shards_dir, full_file = sys.argv[1:3]
files = sorted(glob.glob(f"{shards_dir}/rank-*-of-*.safetensors"))
assert files, f"no shard files in {shards_dir}"
world = int(files[0].rsplit("-of-", 1)[1].split(".")[0])
assert len(files) == world, f"{len(files)} files for world size {world}"
_, full = read(full_file)
rebuilt, covered = {}, {}
for f in files:
    meta, tensors = read(f)
    pieces = json.loads(meta["trainrun_pieces"])
    assert sorted(pieces) == sorted(tensors), f"{f}: metadata and tensors disagree"
    for name, data in tensors.items():
        shape, off = pieces[name]["shape"], pieces[name]["offset"]
        n = math.prod(shape)
        if name not in rebuilt:
            rebuilt[name] = array.array("f", bytes(4 * n))
            covered[name] = bytearray(n)
        assert off + len(data) <= n, f"{f}: {name} piece [{off}, {off + len(data)}) outside {n}"
        for i, x in enumerate(data):
            assert not covered[name][off + i], f"{name}[{off + i}] held by two ranks"
            covered[name][off + i] = 1
            rebuilt[name][off + i] = x
errors = []
if sorted(rebuilt) != sorted(full):
    errors.append(f"names differ: {sorted(set(rebuilt) ^ set(full))}")
for name in rebuilt.keys() & full.keys():
    if not all(covered[name]):
        errors.append(f"{name}: {len(covered[name]) - sum(covered[name])} elements held by no rank")
    elif rebuilt[name].tobytes() != full[name].tobytes():
        errors.append(f"{name}: rebuilt values differ from the full state dict")
if errors:
    print("\n".join(errors[:10]))
    sys.exit(1)
print(f"ok: {len(rebuilt)} tensors rebuilt from {world} ranks' pieces, bitwise equal")
