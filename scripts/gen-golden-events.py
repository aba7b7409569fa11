#!/usr/bin/python3
"""Write the golden KV-event vectors in pkg/events/testdata.

Each vector is NAME.msgpack (a batch as a publisher sends it) and NAME.json
(the events.Batch the Go decoder must produce from it, as encoding/json
writes that struct). The bytes come from the msgpack library, not from the
Go encoder, and follow msgspec's rules as vLLM configures them:

  * the envelope is a positional array [ts, events, data_parallel_rank],
    the rank left out when it is None;
  * array-form events are [tag, field...]; fields with a default that still
    hold it are left out only as a trailing run;
  * map-form events are {"type": tag, field: value...} in declaration order,
    every field still at its default left out;
  * ints take their smallest encoding, floats are float64, str is str and
    bytes are bin.

Vectors named canon-array-* and canon-map-* are exactly what vLLM writes
for the batch in their JSON; the Go tests also require the Go encoder to
reproduce them byte for byte. The others cover what the decoder must
accept from older vLLM and from other publishers.

Needs Debian's python3-msgpack:  apt-get install -y python3-msgpack
Run:  /usr/bin/python3 scripts/gen-golden-events.py [--out DIR]
"""

import argparse
import json
import os
import sys

import msgpack

MASK64 = (1 << 64) - 1
REQUIRED = object()

# Field declarations, in order, with msgspec defaults (REQUIRED: none).
STORED = [
    ("block_hashes", REQUIRED),
    ("parent_block_hash", REQUIRED),
    ("token_ids", REQUIRED),
    ("block_size", REQUIRED),
    ("lora_id", REQUIRED),
    ("medium", REQUIRED),
    ("lora_name", REQUIRED),
    ("extra_keys", None),
    ("group_idx", None),
    ("kv_cache_spec_kind", None),
    ("kv_cache_spec_sliding_window", None),
    ("locality", None),
    ("ownership", None),
]
REMOVED = [("block_hashes", REQUIRED), ("medium", REQUIRED), ("group_idx", None),
           ("locality", None), ("ownership", None)]

# Fields of pending vLLM changes (and other publishers' additions) have no
# agreed position; they are written by name, after the declared ones.
STORED_NAMED = [("block_offsets", None), ("cache_salt", None)]
REMOVED_NAMED = [("remaining_copy_counts", None)]
CLEARED = []

# The oldest vLLM (0.9) declared fewer fields, all required.
STORED_V09 = STORED[:5]
REMOVED_V09 = REMOVED[:1]

SCHEMAS = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": CLEARED}


def array_event(tag, values, schema=None):
    """[tag, fields...] with the trailing run of defaults left out."""
    schema = SCHEMAS[tag] if schema is None else schema
    out = [values.get(name, default) for name, default in schema]
    while out:
        name, default = schema[len(out) - 1]
        if default is REQUIRED or out[-1] != default:
            break
        out.pop()
    return [tag] + out


NAMED = {"BlockStored": STORED_NAMED, "BlockRemoved": REMOVED_NAMED, "AllBlocksCleared": []}


def map_event(tag, values, schema=None):
    """{"type": tag, ...} with every field still at its default left out."""
    schema = SCHEMAS[tag] if schema is None else schema
    out = {"type": tag}
    for name, default in schema + NAMED[tag]:
        value = values.get(name, default)
        if default is not REQUIRED and value == default:
            continue
        out[name] = value
    return out


def envelope(ts, events, rank=None):
    return [ts, events] if rank is None else [ts, events, rank]


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


# --- the decoded form -------------------------------------------------------


def norm_hash(h):
    """vLLM hashes reduced to 64 bits: ints keep their two's-complement bits,
    byte strings give their last 8 bytes, big-endian."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(h[-8:], "big")
    if isinstance(h, str):
        return int.from_bytes(h.encode()[-8:], "big")
    return h & MASK64


def json_value(v):
    """An extra-key element as encoding/json writes the Go value."""
    import base64

    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    return v


TIERS = {"GPU": "GPU", "CPU": "CPU", "STORAGE": "STORAGE", "CPU_TIER1": "CPU", "CPU_TIER2": "STORAGE",
         "FS": "STORAGE", "OBJ": "STORAGE"}


def decoded(kind, hashes=(), parent=None, tokens=(), block_size=0, lora_id=None,
            medium=None, lora_name=None, extra_keys=None, group_idx=None,
            spec_kind=None, window=None, locality=None, ownership=None,
            block_offsets=None, remaining=None, cache_salt=None, mm_keys=None):
    parent_hash = 0 if parent is None else norm_hash(parent)
    bigram = bool(tokens) and isinstance(tokens[0], (list, tuple))
    next_token = 0
    opaque = []
    if bigram:
        next_token = tokens[-1][1]
        tokens = [p[0] for p in tokens]
    else:
        opaque = [i for i, t in enumerate(tokens) if isinstance(t, str)]
        tokens = [0 if isinstance(t, str) else t for t in tokens]
    if extra_keys is not None and all(k is None for k in extra_keys):
        extra_keys = None  # carries nothing
    if mm_keys:
        # Multimodal keys join the block's extras as (mm_key, hash, offset, uuid).
        extra_keys = list(extra_keys or [])
        for i, block in enumerate(mm_keys):
            if not block:
                continue
            while len(extra_keys) <= i:
                extra_keys.append(None)
            extra_keys[i] = list(extra_keys[i] or []) + [
                ["mm_key", k["hash"], k["start_offset"], k.get("uuid")] for k in block]
    return {
        "Kind": kind,
        "BlockHashes": [norm_hash(h) for h in hashes],
        "ParentHash": parent_hash,
        "HasParent": parent_hash != 0,
        "TokenIDs": list(tokens),
        "BlockSize": block_size or 0,
        "LoRAID": lora_id or 0,
        "HasLoRAID": lora_id is not None,
        "LoRAName": lora_name or "",
        "Medium": TIERS.get((medium or "GPU").upper(), "unknown"),
        "ExtraKeys": None if extra_keys is None else [json_value(k) for k in extra_keys],
        "GroupIdx": group_idx or 0,
        "KVCacheSpecKind": spec_kind or "",
        "SlidingWindow": window or 0,
        "BlockOffsets": block_offsets,
        "RemainingCopies": remaining,
        "Bigram": bigram,
        "BigramNext": next_token,
        "OpaqueTokens": opaque or None,
        "CacheSalt": cache_salt or "",
        "Locality": locality if locality in ("LOCAL", "REMOTE") else "",
        "Ownership": ownership or "",
    }


def stored(**kw):
    """Field values of a BlockStored event, and its decoded form."""
    values = {
        "block_hashes": kw.get("hashes", []),
        "parent_block_hash": kw.get("parent"),
        "token_ids": kw.get("tokens", []),
        "block_size": kw.get("block_size", 0),
        "lora_id": kw.get("lora_id"),
        "medium": kw.get("medium", "GPU"),
        "lora_name": kw.get("lora_name"),
        "extra_keys": kw.get("extra_keys"),
        "group_idx": kw.get("group_idx"),
        "kv_cache_spec_kind": kw.get("spec_kind"),
        "kv_cache_spec_sliding_window": kw.get("window"),
        "locality": kw.get("locality"),
        "ownership": kw.get("ownership"),
        "block_offsets": kw.get("block_offsets"),
        "cache_salt": kw.get("cache_salt"),
    }
    return values, decoded("BlockStored", **kw)


def removed(**kw):
    values = {
        "block_hashes": kw.get("hashes", []),
        "medium": kw.get("medium", "GPU"),
        "group_idx": kw.get("group_idx"),
        "locality": kw.get("locality"),
        "ownership": kw.get("ownership"),
        "remaining_copy_counts": kw.get("remaining"),
    }
    return values, decoded("BlockRemoved", **kw)


def cleared():
    return {}, decoded("AllBlocksCleared")


IGNORED = ["locality", "ownership", "session_id", "event_version", "unknown"]


def batch_json(ts, events, rank=None, skipped=0, ignored=None):
    """The decoded batch; ignored counts fields decoded but not acted on,
    by name (as IGNORED lists them)."""
    ignored = ignored or {}
    return {
        "TS": ts,
        "DPRank": rank or 0,
        "HasDPRank": rank is not None,
        "Events": events,
        "Skipped": skipped,
        "Ignored": [ignored.get(name, 0) for name in IGNORED],
    }


def tokens(start, n):
    return list(range(start, start + n))


# --- the vectors ------------------------------------------------------------


def vectors():
    """Yield (name, payload bytes, expected batch as a dict)."""
    s1 = stored(hashes=[0x0102030405060708], tokens=[1, 2, 3, 4], block_size=4)
    yield "canon-array-doc-example", pack(envelope(1.5, [array_event("BlockStored", s1[0])], 0)), \
        batch_json(1.5, [s1[1]], 0)
    yield "canon-map-doc-example", pack(envelope(1.5, [map_event("BlockStored", s1[0])], 0)), \
        batch_json(1.5, [s1[1]], 0)

    # A realistic step: two stored runs, a removal, each encoding.
    run1 = stored(hashes=[0x9E3779B97F4A7C15, 0x243F6A8885A308D3], tokens=tokens(1000, 32),
                  block_size=16)
    run2 = stored(hashes=[0xB7E151628AED2A6A], parent=0x243F6A8885A308D3,
                  tokens=tokens(151000, 16), block_size=16, lora_id=3, lora_name="sql-adapter")
    gone = removed(hashes=[0x13198A2E03707344, 5])
    step = [run1, run2, gone]
    yield "canon-array-step", \
        pack(envelope(1733000000.25, [array_event(k, v[0]) for k, v in
                                       zip(["BlockStored", "BlockStored", "BlockRemoved"], step)], 0)), \
        batch_json(1733000000.25, [v[1] for v in step], 0)
    yield "canon-map-step", \
        pack(envelope(1733000000.25, [map_event(k, v[0]) for k, v in
                                       zip(["BlockStored", "BlockStored", "BlockRemoved"], step)], 2)), \
        batch_json(1733000000.25, [v[1] for v in step], 2)

    # Every optional field set; extra keys of several shapes.
    full = stored(hashes=[11, 12, 13], parent=10, tokens=tokens(0, 6), block_size=2,
                  lora_id=7, lora_name="fr", medium="CPU",
                  extra_keys=[["fr", "salt-1"], None, ["fr", b"\x00\x01\xfe\xff", 300, -2]],
                  group_idx=1, spec_kind="sliding_window", window=4096)
    full_rm = removed(hashes=[11], medium="CPU", group_idx=1)
    for enc, fn in (("array", array_event), ("map", map_event)):
        yield "canon-%s-all-fields" % enc, \
            pack(envelope(2.0, [fn("BlockStored", full[0]), fn("BlockRemoved", full_rm[0]),
                                fn("AllBlocksCleared", {})], 1)), \
            batch_json(2.0, [full[1], full_rm[1], cleared()[1]], 1)

    # Only a cache-spec kind: group_idx is written (0) before it, extra_keys
    # as nil in array form and not at all in map form.
    spec = stored(hashes=[21], tokens=tokens(5, 16), block_size=16, group_idx=0,
                  spec_kind="full_attention")
    for enc, fn in (("array", array_event), ("map", map_event)):
        yield "canon-%s-spec-kind-only" % enc, pack(envelope(3.0, [fn("BlockStored", spec[0])], 0)), \
            batch_json(3.0, [spec[1]], 0)

    # Storage tier and a placeholder store (no tokens, block size 0).
    place = stored(hashes=[31, 32], medium="CPU")
    disk = stored(hashes=[33], tokens=tokens(9, 16), block_size=16, medium="STORAGE")
    disk_rm = removed(hashes=[33], medium="STORAGE")
    yield "canon-array-tiers", \
        pack(envelope(4.0, [array_event("BlockStored", place[0]), array_event("BlockStored", disk[0]),
                            array_event("BlockRemoved", disk_rm[0])], 0)), \
        batch_json(4.0, [place[1], disk[1], disk_rm[1]], 0)

    yield "canon-array-empty", pack(envelope(5.0, [], 0)), batch_json(5.0, [], 0)

    # vLLM 0.9: two-element envelope, five BlockStored fields, bare removal.
    old = stored(hashes=[41, 42], parent=40, tokens=tokens(100, 32), block_size=16)
    old_rm = removed(hashes=[40])
    yield "vllm-0.9-oldest", \
        pack(envelope(6.0, [array_event("BlockStored", old[0], STORED_V09),
                            array_event("BlockRemoved", old_rm[0], REMOVED_V09),
                            array_event("AllBlocksCleared", {})])), \
        batch_json(6.0, [old[1], old_rm[1], cleared()[1]])

    # Only the first four fields after the tag.
    four = stored(hashes=[43], tokens=tokens(1, 4), block_size=4)
    yield "array-four-fields", \
        pack(envelope(6.5, [["BlockStored", [43], None, tokens(1, 4), 4]], 0)), \
        batch_json(6.5, [four[1]], 0)

    # vLLM 0.26: extra_keys as a list of Nones (carries nothing), group_idx 0
    # and the spec kind on every store.
    new = stored(hashes=[51, 52], tokens=tokens(7, 32), block_size=16, extra_keys=[None, None],
                 group_idx=0, spec_kind="full_attention")
    new_rm = removed(hashes=[51], group_idx=0)
    yield "vllm-0.26-map", \
        pack(envelope(7.0, [map_event("BlockStored", new[0]), map_event("BlockRemoved", new_rm[0])], 0)), \
        batch_json(7.0, [new[1], new_rm[1]], 0)

    # Trailing nils kept, and 0 for "no parent", as other publishers write.
    nils = stored(hashes=[61], tokens=tokens(3, 4), block_size=4)
    yield "array-trailing-nils-zero-parent", \
        pack(envelope(8.0, [["BlockStored", [61], 0, tokens(3, 4), 4, None, None, None, None, None, None, None],
                            ["BlockRemoved", [61], None, None]], None)), \
        batch_json(8.0, [nils[1], removed(hashes=[61])[1]])

    # Keys in any order, "type" not first, unknown keys of every shape,
    # lora_id and lora_name left out.
    odd = stored(hashes=[71], parent=70, tokens=tokens(11, 4), block_size=4, medium="CPU")
    yield "map-any-key-order", \
        pack(envelope(9.0, [{
            "event_version": 2,
            "token_ids": tokens(11, 4),
            "locality": {"node": "n1", "rack": [1, 2, {"x": None}]},
            "block_size": 4,
            "type": "BlockStored",
            "medium": "CPU",
            "ownership": b"\x01\x02",
            "parent_block_hash": 70,
            "block_hashes": [71],
        }, {"block_hashes": [70], "type": "BlockRemoved", "future": [1.5, True]}], 0)), \
        batch_json(9.0, [dict(odd[1], Ownership="\x01\x02"), removed(hashes=[70])[1]], 0,
                   ignored={"ownership": 1, "event_version": 1, "unknown": 2})

    # Map envelope, keys out of order, with an unknown key.
    env = stored(hashes=[81], tokens=tokens(1, 4), block_size=4)
    yield "map-envelope", \
        pack({"events": [array_event("BlockStored", env[0])], "data_parallel_rank": 3,
              "producer": "sim", "ts": 10.5}), \
        batch_json(10.5, [env[1]], 3)

    # Array and map events in one batch.
    a = stored(hashes=[91], tokens=tokens(1, 4), block_size=4)
    m = stored(hashes=[92], parent=91, tokens=tokens(5, 4), block_size=4)
    yield "mixed-encodings", \
        pack(envelope(11.0, [array_event("BlockStored", a[0]), map_event("BlockStored", m[0]),
                             array_event("BlockRemoved", removed(hashes=[91])[0]),
                             map_event("AllBlocksCleared", {})], 0)), \
        batch_json(11.0, [a[1], m[1], removed(hashes=[91])[1], cleared()[1]], 0)

    # Hashes at every int width the smallest encoding picks, negative ones
    # (Python hash() from very old vLLM) included.
    widths = [5, 200, 60000, 4000000000, 2**64 - 1, -1, -100, -30000, -2000000000, -2**63]
    w = stored(hashes=widths, parent=-7, tokens=[0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1],
               block_size=8)
    yield "hash-int-widths", pack(envelope(12.0, [array_event("BlockStored", w[0])], 0)), \
        batch_json(12.0, [w[1]], 0)

    # Hashes as raw digests: bin of 8, 16 and 32 bytes, and str.
    sha = bytes(range(32))
    xxh = bytes(range(100, 116))
    h8 = b"\xff" * 8
    b = stored(hashes=[sha, xxh, h8, "0123456789abcdef"], parent=bytes(32),
               tokens=tokens(1, 16), block_size=4)
    rm = removed(hashes=[sha])
    yield "hash-bytes", \
        pack(envelope(13.0, [array_event("BlockStored", b[0]), map_event("BlockRemoved", rm[0])], 0)), \
        batch_json(13.0, [b[1], rm[1]], 0)

    # Unknown tags (both encodings) and an unknown medium are left out and
    # counted; a tier in lower case is still a tier.
    keep = stored(hashes=[101], tokens=tokens(1, 4), block_size=4, medium="cpu")
    yield "unknown-events-skipped", \
        pack(envelope(14.0, [
            ["BlockPinned", [1, 2], {"why": "test"}],
            array_event("BlockStored", keep[0]),
            {"type": "BlockMigrated", "block_hashes": "not even a list"},
            array_event("BlockStored", stored(hashes=[102], medium="NVME")[0]),
            map_event("BlockRemoved", removed(hashes=[101], medium="HBM")[0]),
        ], 0)), \
        batch_json(14.0, [keep[1]], 0, skipped=4)

    yield from vllm_newer_vectors()
    yield from publisher_vectors()

    # Non-minimal int widths, as some Go publishers write every int as 64 bits.
    def u64(v):
        return b"\xcf" + v.to_bytes(8, "big")

    def i64(v):
        return b"\xd3" + (v & MASK64).to_bytes(8, "big")

    def u32(v):
        return b"\xce" + v.to_bytes(4, "big")

    ev = (b"\x96" + pack("BlockStored") + b"\x92" + u64(1) + i64(-2) + u64(0)
          + b"\x94" + u32(1) + u64(2) + i64(3) + b"\xd1\x00\x04" + i64(4) + u64(7))
    wide = stored(hashes=[1, -2], tokens=[1, 2, 3, 4], block_size=4, lora_id=7)
    yield "non-minimal-int-widths", b"\x93" + pack(3.25) + b"\x91" + ev + i64(0), \
        batch_json(3.25, [wide[1]], 0)


def vllm_newer_vectors():
    """vLLM's fields since 0.26, merged and pending, as msgspec writes them
    in map form (vLLM writes maps since it added them)."""
    # Self-describing CPU offload (0.26, #43468/#48679): the CPU store of a
    # chunk of two GPU blocks carries its hashes, parent, tokens and the
    # per-block size, where the older placeholder carried only hashes.
    gpu = stored(hashes=[0xA1, 0xA2, 0xA3], tokens=tokens(500, 48), block_size=16,
                 extra_keys=[None, None, None], group_idx=0, spec_kind="full_attention")
    cpu = stored(hashes=[0xA2, 0xA3], parent=0xA1, tokens=tokens(516, 32), block_size=16,
                 medium="CPU", group_idx=0, spec_kind="full_attention")
    gpu_rm = removed(hashes=[0xA3], group_idx=0)
    yield "vllm-offload-self-describing", \
        pack(envelope(20.0, [map_event("BlockStored", gpu[0]), map_event("BlockStored", cpu[0]),
                             map_event("BlockRemoved", gpu_rm[0])], 0)), \
        batch_json(20.0, [gpu[1], cpu[1], gpu_rm[1]], 0)

    # Storage tiers with locality (#48281) and ownership (#52067); 0.26's
    # FS and OBJ media, which 0.27 folds into STORAGE.
    fs = stored(hashes=[0xB1], tokens=tokens(7, 16), block_size=16, medium="FS",
                locality="LOCAL", ownership="fs-tier-0")
    obj = stored(hashes=[0xB1], medium="OBJ", locality="REMOTE", ownership="obj-tier-0")
    st = stored(hashes=[0xB2], parent=0xB1, tokens=tokens(23, 16), block_size=16, medium="STORAGE",
                locality="REMOTE")
    st_rm = removed(hashes=[0xB2], medium="STORAGE", locality="REMOTE")
    yield "vllm-storage-locality-ownership", \
        pack(envelope(21.0, [map_event("BlockStored", fs[0]), map_event("BlockStored", obj[0]),
                             map_event("BlockStored", st[0]), map_event("BlockRemoved", st_rm[0])], 0)), \
        batch_json(21.0, [fs[1], obj[1], st[1], st_rm[1]], 0, ignored={"locality": 4, "ownership": 2})

    # Pending (#48933): removals that say how many copies remain.
    dup = stored(hashes=[0xC1], tokens=tokens(90, 16), block_size=16)
    rm = removed(hashes=[0xC1, 0xC2], remaining=[1, 0])
    yield "vllm-pending-remaining-copy-counts", \
        pack(envelope(22.0, [map_event("BlockStored", dup[0]), map_event("BlockStored", dup[0]),
                             map_event("BlockRemoved", rm[0])], 0)), \
        batch_json(22.0, [dup[1], dup[1], rm[1]], 0)

    # A hybrid model: a full-attention group and a sliding-window group store
    # the same logical blocks under the same hashes; a Mamba group in align
    # mode stores only the last block's state, and (pending #44488) says with
    # block_offsets which chunk of the tokens that is.
    fa = stored(hashes=[0xD1, 0xD2, 0xD3], tokens=tokens(1, 12), block_size=4, group_idx=0,
                spec_kind="full_attention")
    sw = stored(hashes=[0xD1, 0xD2, 0xD3], tokens=tokens(1, 12), block_size=4, group_idx=1,
                spec_kind="sliding_window", window=8)
    mamba = stored(hashes=[0xD3], tokens=tokens(1, 12), block_size=4, group_idx=2,
                   spec_kind="mamba", block_offsets=[2])
    sw_rm = removed(hashes=[0xD1], group_idx=1)
    yield "vllm-hybrid-groups", \
        pack(envelope(23.0, [map_event("BlockStored", fa[0]), map_event("BlockStored", sw[0]),
                             map_event("BlockStored", mamba[0]), map_event("BlockRemoved", sw_rm[0])], 0)), \
        batch_json(23.0, [fa[1], sw[1], mamba[1], sw_rm[1]], 0)

    # Extra keys as the newest vLLM folds them: the LoRA name on every block,
    # multimodal items as (identifier, offset in the block), the cache salt on
    # the first block, prompt-embedding digests as bytes.
    ex = stored(hashes=[0xE1, 0xE2, 0xE3], tokens=tokens(200, 12), block_size=4, lora_name="sql",
                extra_keys=[["sql", "salt-7"], ["sql", ["img-sha-1", 2]], ["sql", b"\x9a" * 32]],
                group_idx=0, spec_kind="full_attention")
    yield "vllm-extra-keys-lora-mm-salt-embeds", \
        pack(envelope(24.0, [map_event("BlockStored", ex[0])], 0)), batch_json(24.0, [ex[1]], 0)


# SGLang writes vLLM's early array form, positional, with its own additions.
SGLANG_STORED = STORED[:6]  # block_hashes .. medium


def sglang_event(tag, values, metadata=None):
    """An SGLang event: positional fields through medium, then (when any is
    set) its metadata map in the next position."""
    if tag == "BlockStored":
        out = [tag] + [values.get(name) for name, _ in SGLANG_STORED]
        if metadata:
            out.append(metadata)
        return out
    if tag == "BlockRemoved":
        return [tag, values["block_hashes"], values.get("medium", "GPU")]
    return [tag]


def publisher_vectors():
    """Batches as the other publishers of vLLM's format write them."""
    # SGLang, default page size 1: every token is a block, stores coalesced
    # into one event per run; the envelope carries attn_dp_rank.
    run = stored(hashes=[0x51, 0x52, 0x53, 0x54], tokens=[11, 12, 13, 14], block_size=1)
    more = stored(hashes=[0x55, 0x56], parent=0x54, tokens=[15, 16], block_size=1)
    gone = removed(hashes=[0x56, 0x55])
    yield "sglang-page-size-1", \
        pack(envelope(30.0, [sglang_event("BlockStored", run[0]), sglang_event("BlockStored", more[0]),
                             sglang_event("BlockRemoved", gone[0])], 1)), \
        batch_json(30.0, [run[1], more[1], gone[1]], 1)

    # SGLang with a cache salt: its metadata map follows medium, naming the
    # salt (and the session) that namespace the run.
    salted = stored(hashes=[0x61, 0x62], tokens=tokens(40, 32), block_size=16, cache_salt="tenant-a")
    yield "sglang-salted-metadata", \
        pack(envelope(31.0, [sglang_event("BlockStored", salted[0],
                                          {"cache_salt": "tenant-a", "session_id": "s-9"})], 0)), \
        batch_json(31.0, [salted[1]], 0, ignored={"session_id": 1})

    # SGLang with EAGLE speculative decoding: token_ids are pairs of adjacent
    # tokens, so a page of 4 names 5 tokens.
    pairs = [[t, t + 1] for t in range(100, 108)]
    eagle = stored(hashes=[0x71, 0x72], tokens=pairs, block_size=4)
    yield "sglang-eagle-bigram", \
        pack(envelope(32.0, [sglang_event("BlockStored", eagle[0])], 0)), batch_json(32.0, [eagle[1]], 0)

    # SGLang's hierarchical cache: host memory and its storage backend.
    host = stored(hashes=[0x71], tokens=[(p[0]) for p in pairs[:4]], block_size=4, medium="CPU_TIER1")
    disk = stored(hashes=[0x71], medium="CPU_TIER2")
    host_rm = removed(hashes=[0x71], medium="CPU_TIER1")
    yield "sglang-hicache-tiers", \
        pack(envelope(33.0, [sglang_event("BlockStored", host[0]), sglang_event("BlockStored", disk[0]),
                             sglang_event("BlockRemoved", host_rm[0])], 0)), \
        batch_json(33.0, [host[1], disk[1], host_rm[1]], 0)

    # LMCache: CPU stores of whole chunks (here 256 tokens, 16 blocks of 16)
    # in vLLM's map form, never removed; older releases wrote "cpu".
    chunk1 = stored(hashes=[0x81], tokens=tokens(1000, 256), block_size=256, medium="cpu")
    chunk2 = stored(hashes=[0x82], parent=0x81, tokens=tokens(1256, 256), block_size=256, medium="CPU")
    yield "lmcache-store-only-chunks", \
        pack(envelope(34.0, [map_event("BlockStored", chunk1[0]), map_event("BlockStored", chunk2[0])], 0)), \
        batch_json(34.0, [chunk1[1], chunk2[1]], 0)

    # TensorRT-LLM: map form with tokens_per_block 32, multimodal keys per
    # block as tagged maps, and a multimodal token written as a string.
    mm = [None, [{"type": "mm_key", "hash": "9f" * 16, "start_offset": 3}]]
    trt_tokens = tokens(10, 32) + ["mm:9f"] + tokens(43, 31)
    trt = stored(hashes=[0x91, 0x92], tokens=trt_tokens, block_size=32, mm_keys=mm)
    trt_values = dict(trt[0], mm_keys=mm)
    event = map_event("BlockStored", trt_values)
    event["mm_keys"] = mm
    trt_rm = removed(hashes=[0x92])
    yield "trtllm-map-mm-keys", \
        pack(envelope(35.0, [event, map_event("BlockRemoved", trt_rm[0])], 3)), \
        batch_json(35.0, [trt[1], trt_rm[1]], 3)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "pkg", "events", "testdata")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out, help="directory to write the vectors to")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = set()
    for name, payload, expected in vectors():
        if name in names:
            sys.exit("duplicate vector name " + name)
        names.add(name)
        with open(os.path.join(args.out, name + ".msgpack"), "wb") as f:
            f.write(payload)
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(expected, f, indent=2)
            f.write("\n")
    print("wrote %d vectors to %s" % (len(names), os.path.normpath(args.out)))


if __name__ == "__main__":
    main()
