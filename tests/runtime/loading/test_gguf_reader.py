"""The GGUF reader against files written from the spec by the test's own writer (and by the `gguf` package when it
is installed), and each dequantiser against a naive per-element reference."""

from __future__ import annotations

import random
import re
import struct

import numpy as np
import pytest

from radixcache.runtime.loading.gguf import GGML_TYPE_IDS, GGUFError, GGUFFile, dequantize


def naive_dequantize(raw: bytes, ttype: str, n: int) -> list[float]:
    """Straight from ggml's block definitions, one element at a time."""
    out: list[float] = []
    if ttype == "F32":
        return list(struct.unpack(f"<{n}f", raw))
    if ttype == "F16":
        return list(struct.unpack(f"<{n}e", raw))
    if ttype == "BF16":
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{n}H", raw)]
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[ttype]
    for b in range(n // 32):
        block = raw[b * size : (b + 1) * size]
        (d,) = struct.unpack_from("<e", block, 0)
        if ttype == "Q8_0":
            out += [d * q for q in struct.unpack_from("<32b", block, 2)]
            continue
        m = struct.unpack_from("<e", block, 2)[0] if ttype == "Q4_1" else 0.0
        qs = block[-16:]
        nibbles = [qs[j] & 0x0F for j in range(16)] + [qs[j] >> 4 for j in range(16)]
        out += [d * (q - 8) for q in nibbles] if ttype == "Q4_0" else [d * q + m for q in nibbles]
    return out


TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]


@pytest.mark.parametrize("ttype", TYPES)
@pytest.mark.parametrize("shape", [(3, 64), (2, 2, 32), (96,)])
def test_dequantize_matches_naive_reference(kit, ttype, shape):
    rng = np.random.default_rng(hash((ttype, shape)) % 2**32)
    x = rng.normal(0, 0.5, size=shape).astype(np.float32)
    raw = kit.quantize(x, ttype)
    got = dequantize(np.frombuffer(raw, np.uint8), GGML_TYPE_IDS[ttype], shape)
    assert got.dtype == np.float32 and got.shape == shape
    ref = np.array(naive_dequantize(raw, ttype, x.size), dtype=np.float32).reshape(shape)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    # And the round trip is within the format's precision.
    tol = {"F32": 0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 0.02, "Q4_0": 0.25, "Q4_1": 0.15}[ttype]
    assert np.abs(got - x).max() <= tol * max(1.0, float(np.abs(x).max()))


def test_reader_reads_every_metadata_type_and_tensor_offsets(kit, tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 32)).astype(np.float32)
    b = rng.normal(size=(64,)).astype(np.float32)
    meta = {
        "general.architecture": "llama",
        "u8": (kit.T_U8, 200),
        "i8": (kit.T_I8, -5),
        "u16": (kit.T_U16, 60000),
        "i16": (kit.T_I16, -300),
        "u32": (kit.T_U32, 4_000_000_000),
        "i32": (kit.T_I32, -7),
        "f32": (kit.T_F32, 0.5),
        "bool": (kit.T_BOOL, True),
        "u64": (kit.T_U64, 2**40),
        "i64": (kit.T_I64, -(2**40)),
        "f64": (kit.T_F64, 0.1),
        "str": "héllo ✓",
        "strs": (kit.T_ARR, kit.T_STR, ["", "a b", "日本", "x" * 300]),
        "ints": (kit.T_ARR, kit.T_I32, [1, -2, 3]),
        "nested": (kit.T_ARR, kit.T_ARR, [[1, 2], [3]]),
    }
    path = tmp_path / "m.gguf"
    kit.write_gguf(
        path,
        meta,
        [("a", a.shape, "F32", kit.quantize(a, "F32")), ("b", b.shape, "F16", kit.quantize(b, "F16"))],
        alignment=64,
    )
    with GGUFFile(path) as f:
        m = f.metadata
        assert f.version == 3 and f.alignment == 64 and f.data_offset % 64 == 0
        assert (m["u8"], m["i8"], m["u16"], m["i16"], m["u32"], m["i32"]) == (200, -5, 60000, -300, 4_000_000_000, -7)
        assert (m["f32"], m["bool"], m["u64"], m["i64"], m["f64"]) == (0.5, True, 2**40, -(2**40), 0.1)
        assert m["str"] == "héllo ✓" and m["strs"] == ["", "a b", "日本", "x" * 300]
        assert m["ints"].tolist() == [1, -2, 3] and [x.tolist() for x in m["nested"]] == [[1, 2], [3]]
        assert f.tensors["a"].shape == (4, 32) and f.tensors["a"].type_name == "F32"
        np.testing.assert_array_equal(f.dequantize("a"), a)
        np.testing.assert_array_equal(f.dequantize("b"), b.astype(np.float16).astype(np.float32))
        out = f.dequantize("a")
    out += 1  # dequantised arrays are writable copies that outlive the file


def test_reader_accepts_version_2(kit, tmp_path):
    x = np.arange(32, dtype=np.float32)
    kit.write_gguf(tmp_path / "v2.gguf", {"k": "v"}, [("x", (32,), "F32", x.tobytes())], version=2)
    with GGUFFile(tmp_path / "v2.gguf") as f:
        assert f.version == 2 and f.metadata["k"] == "v"
        np.testing.assert_array_equal(f.dequantize("x"), x)


def test_reader_rejects_bad_files_clearly(kit, tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + b"\0" * 40)
    (tmp_path / "v1.gguf").write_bytes(b"GGUF" + struct.pack("<III", 1, 0, 0))
    kit.write_gguf(tmp_path / "full.gguf", {"k": "value"}, [("x", (32,), "F32", bytes(128))])
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "full.gguf").read_bytes()[:30])
    for name, message in [("empty", "empty"), ("magic", "not a GGUF"), ("v1", "version 1"), ("cut", "truncated")]:
        with pytest.raises(GGUFError, match=message):
            GGUFFile(tmp_path / f"{name}.gguf")


def test_unsupported_quant_type_is_named():
    with pytest.raises(NotImplementedError, match="Q2_K"):
        dequantize(np.zeros(84, np.uint8), GGML_TYPE_IDS["Q2_K"], (256,))


@pytest.mark.parametrize("ttype", TYPES)
def test_reader_agrees_with_the_gguf_package_writer(tmp_path, ttype):
    gguf = pytest.importorskip("gguf", reason="the gguf package (an independent writer) is not installed")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 64)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[ttype]
    data = x if ttype == "F32" else x.astype(np.float16) if ttype == "F16" else gguf.quants.quantize(x, qtype)
    w = gguf.GGUFWriter(tmp_path / "g.gguf", "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_array("tokenizer.ggml.tokens", ["a", "bc", "✓"])
    w.add_tensor("t", data, raw_dtype=qtype if ttype not in ("F32", "F16") else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(tmp_path / "g.gguf") as f:
        assert f.metadata["llama.block_count"] == 2 and f.metadata["tokenizer.ggml.tokens"] == ["a", "bc", "✓"]
        ref = gguf.quants.dequantize(np.asarray(data), qtype).reshape(x.shape) if ttype != "F32" else x
        np.testing.assert_array_equal(f.dequantize("t"), ref.astype(np.float32))


def test_corrupted_files_fail_with_gguf_errors_only(kit, tmp_path):
    meta = {"a": "x", "arr": (kit.T_ARR, kit.T_STR, ["ab", "c"]), "n": (kit.T_ARR, kit.T_I32, [1, 2])}
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    kit.write_gguf(tmp_path / "ok.gguf", meta, [("t", (2, 32), "Q8_0", kit.quantize(x, "Q8_0"))])
    data = (tmp_path / "ok.gguf").read_bytes()
    rng = random.Random(0)
    for i in range(400):
        corrupt = bytearray(data[: rng.randrange(len(data))] if i % 2 else data)
        for _ in range(0 if i % 2 else 3):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        (tmp_path / "bad.gguf").write_bytes(bytes(corrupt))
        try:
            with GGUFFile(tmp_path / "bad.gguf") as f:
                for name in f.tensors:
                    f.dequantize(name)
        except (GGUFError, NotImplementedError):
            pass


def _one_key_file(value_type: int, value: bytes) -> bytes:
    """A GGUF file with no tensors and one metadata key "k" of `value_type` holding the encoded `value`."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", value_type) + value


def test_arrays_nested_past_the_recursion_limit_are_a_gguf_error(tmp_path):
    """An array of arrays 5,000 deep (60 kB) raised RecursionError, not a GGUFError."""
    nested = struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)  # ARRAY of ARRAY ... of 0 UINT32
    (tmp_path / "deep.gguf").write_bytes(_one_key_file(9, nested))
    with pytest.raises(GGUFError, match=r"deep\.gguf: truncated or corrupt"):
        GGUFFile(tmp_path / "deep.gguf")


def test_a_string_in_an_array_that_runs_past_the_end_is_a_gguf_error(tmp_path):
    """A vocabulary string said to be 2**62 bytes long was cut at the end of the file and read as 'abc'."""
    strings = struct.pack("<IQ", 8, 1) + struct.pack("<Q", 2**62) + b"abc"  # ARRAY of 1 STRING
    (tmp_path / "long.gguf").write_bytes(_one_key_file(9, strings))
    with pytest.raises(GGUFError, match=r"long\.gguf: string runs past the end of the file"):
        GGUFFile(tmp_path / "long.gguf")


def test_a_row_that_is_not_whole_blocks_names_the_file_and_tensor(kit, tmp_path):
    kit.write_gguf(tmp_path / "rows.gguf", {}, [("w", (2, 32), "Q8_0", bytes(68))])
    data = (tmp_path / "rows.gguf").read_bytes().replace(struct.pack("<2Q", 32, 2), struct.pack("<2Q", 33, 2))
    (tmp_path / "rows.gguf").write_bytes(data)
    with pytest.raises(GGUFError, match=r"rows\.gguf: tensor w: row length 33 is not a multiple of the Q8_0 block"):
        GGUFFile(tmp_path / "rows.gguf")


def test_a_key_or_tensor_that_appears_twice_is_a_gguf_error(kit, tmp_path):
    """The last of two same-named tensors (or keys) was read silently, where llama.cpp refuses the file."""
    x, y = np.zeros(32, np.float32), np.ones(32, np.float32)
    kit.write_gguf(tmp_path / "t.gguf", {"k": 1}, [("w", (32,), "F32", x.tobytes()), ("w", (32,), "F32", y.tobytes())])
    with pytest.raises(GGUFError, match=r"t\.gguf: tensor w appears twice in the tensor index"):
        GGUFFile(tmp_path / "t.gguf")
    kit.write_gguf(tmp_path / "k.gguf", {"ka": 1, "kb": 2}, [("w", (32,), "F32", x.tobytes())])
    (tmp_path / "k.gguf").write_bytes((tmp_path / "k.gguf").read_bytes().replace(b"kb", b"ka"))
    with pytest.raises(GGUFError, match=r"k\.gguf: metadata key 'ka' appears twice"):
        GGUFFile(tmp_path / "k.gguf")


@pytest.mark.parametrize(
    "value",
    [(9, 4, [32, 32]), "32", "abc", (6, 32.0), (7, True), (4, 0), (4, 48)],
    ids=["array", "text-number", "text", "float", "bool", "zero", "not-power-of-two"],
)
def test_an_alignment_of_the_wrong_type_or_value_is_named(kit, tmp_path, value):
    """An array was a TypeError naming neither file nor key, "abc" a "corrupt header", "32" read as 32."""
    x = np.zeros(32, np.float32)
    kit.write_gguf(tmp_path / "a.gguf", {"general.alignment": value}, [("w", (32,), "F32", x.tobytes())])
    with pytest.raises(GGUFError, match=r"a\.gguf: metadata general\.alignment is .*, not a power of two"):
        GGUFFile(tmp_path / "a.gguf")


@pytest.mark.parametrize("value", [(4, 2**31), (10, 2**63), (4, 4096)], ids=["2**31", "2**63", "past-a-small-file"])
def test_an_alignment_that_puts_the_tensor_data_past_the_file_is_named(kit, tmp_path, value):
    """A power of two as large as 2**31 or 2**63 passed, and the error blamed the first tensor for running past the
    end of the file; a file without tensors keeps opening (its alignment places nothing)."""
    x = np.zeros(32, np.float32)
    kit.write_gguf(tmp_path / "a.gguf", {"general.alignment": value}, [("w", (32,), "F32", x.tobytes())])
    with pytest.raises(GGUFError, match=rf"a\.gguf: metadata general\.alignment is {value[1]}: .* past the end"):
        GGUFFile(tmp_path / "a.gguf")
    kit.write_gguf(tmp_path / "b.gguf", {"general.alignment": value, "general.name": "m"}, [])
    assert GGUFFile(tmp_path / "b.gguf").metadata["general.name"] == "m"


def test_a_file_cut_short_names_the_key_or_tensor_it_was_cut_in(kit, tmp_path):
    """A download stopped in the vocabulary or in the tensor index said only "truncated or corrupt GGUF header",
    naming neither the key nor the tensor."""
    tokens = (kit.T_ARR, kit.T_STR, ["a", "bc", "def"])
    kit.write_gguf(
        tmp_path / "full.gguf",
        {"general.name": "m", "tokenizer.ggml.tokens": tokens},
        [("w.x", (32,), "F32", bytes(128))],
    )
    data = (tmp_path / "full.gguf").read_bytes()
    for cut, where in [
        (data.index(b"def") + 1, "in metadata key 'tokenizer.ggml.tokens' (entry 2 of 2)"),
        (data.index(b"tokenizer.ggml") + 3, "in metadata entry 2 of 2, its key"),
        (data.index(b"w.x") + 5, "in tensor index entry 'w.x' (1 of 1)"),
    ]:
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(GGUFError, match=r"cut\.gguf: .*" + re.escape(where)):
            GGUFFile(tmp_path / "cut.gguf")


@pytest.mark.parametrize("etype", [4, 8, 9], ids=["uint32", "string", "array"])
def test_an_array_said_to_hold_2_62_elements_is_refused_naming_its_key(tmp_path, etype):
    (tmp_path / "huge.gguf").write_bytes(_one_key_file(9, struct.pack("<IQ", etype, 2**62) + bytes(64)))
    message = f"huge.gguf: an array of {2**62} elements runs past the end of the file (in metadata key 'k' (entry 1"
    with pytest.raises(GGUFError, match=re.escape(message)):
        GGUFFile(tmp_path / "huge.gguf")
