#!/usr/bin/env python3
"""Independent reader of a LoRA adapter directory in PEFT's layout (json + struct only).

usage: check_adapter.py ADAPTER_DIR R LAYER:IN:OUT...
Checks adapter_config.json (peft_type LORA, r, target_modules = the layers) and
adapter_model.safetensors (8-byte little-endian header length, JSON header, F32 data whose
offsets tile the data section): base_model.model.<layer>.lora_A.weight [R, IN] and
...lora_B.weight [OUT, R] for every layer, all finite, lora_B not all zero (it trained)."""
import json, math, os, struct, sys

adapter, r = sys.argv[1], int(sys.argv[2])
layers = {}
for spec in sys.argv[3:]:
    name, i, o = spec.rsplit(":", 2)
    layers[name] = (int(i), int(o))

cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
assert cfg["peft_type"] == "LORA", cfg["peft_type"]
assert cfg["r"] == r, (cfg["r"], r)
assert sorted(cfg["target_modules"]) == sorted(layers), (cfg["target_modules"], sorted(layers))
for key in ("lora_alpha", "lora_dropout", "bias", "use_rslora", "fan_in_fan_out"):
    assert key in cfg, key

path = os.path.join(adapter, "adapter_model.safetensors")
blob = open(path, "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n].decode("utf-8"))
data = blob[8 + n:]
meta = header.pop("__metadata__", {})
spans = []
for name, t in header.items():
    assert t["dtype"] == "F32", (name, t["dtype"])
    b, e = t["data_offsets"]
    assert e - b == 4 * math.prod(t["shape"]), name
    spans.append((b, e))
spans.sort()
pos = 0
for b, e in spans:
    assert b == pos, "data offsets do not tile the data section"
    pos = e
assert pos == len(data), (pos, len(data))

def values(name):
    b, e = header[name]["data_offsets"]
    return struct.unpack("<%df" % ((e - b) // 4), data[b:e])

expected = set()
for layer, (i, o) in layers.items():
    a, bname = "base_model.model.%s.lora_A.weight" % layer, "base_model.model.%s.lora_B.weight" % layer
    expected |= {a, bname}
    assert header[a]["shape"] == [r, i], (a, header[a]["shape"])
    assert header[bname]["shape"] == [o, r], (bname, header[bname]["shape"])
    va, vb = values(a), values(bname)
    assert all(math.isfinite(v) for v in va + vb), layer
    assert any(v != 0 for v in vb), "lora_B of %s is all zero: the adapter did not train" % layer
extra = set(header) - expected
assert all(k.endswith(".bias") for k in extra), extra
print("adapter ok: %d tensors, %d layers, r %d, %d bytes, metadata %s" % (len(header), len(layers), r, len(blob), meta))
