#!/usr/bin/env python3
"""Tests of models/build.py: `python3 models/test_build.py` (standard library only).

The main test makes a fake trained model from models/all-MiniLM-L6-v2 (as `decide train` writes
one: bare names, every tensor F32, no pooler) with encoder layers 4 and 5 changed by +0.001,
extracts the delta (float16 differences from the base), assembles the model and checks the
result. It is skipped when the base model is not there
(run models/fetch). The other tests use tiny made-up models.
"""

import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build  # noqa: E402

BASE = os.path.join(HERE, "all-MiniLM-L6-v2")
CHANGED = ("encoder.layer.4.", "encoder.layer.5.")
DELTA_META = {"format": "pt", "delta": "difference"}


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def run(*argv):
    """Runs build.py's main in-process; returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = build.main(list(argv))
    return status, out.getvalue(), err.getvalue()


def read(path):
    with open(path, "rb") as f:
        return f.read()


@unittest.skipUnless(
    os.path.isfile(os.path.join(BASE, "model.safetensors")),
    "models/all-MiniLM-L6-v2/model.safetensors is missing; run models/fetch",
)
class RealBase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="decide-build-test-")
        cls.base, _ = build.read_safetensors(os.path.join(BASE, "model.safetensors"))
        trained = {}
        cls.perturbed = {}
        for name, t in cls.base.items():
            if name.startswith("pooler."):
                continue  # a bi-encoder trained by `decide train` has no pooler
            if name.startswith(CHANGED):
                n = t.count
                values = [v + 0.001 for v in struct.unpack(f"<{n}f", t.data)]
                t = build.Tensor("F32", t.shape, f32(values))
                cls.perturbed[name] = t
            elif t.dtype != "F32":
                # decide train saves every tensor as F32, position ids too.
                t = build.Tensor("F32", t.shape, build.to_f32(t, name))
            trained[name] = t
        cls.trained_dir = os.path.join(cls.tmp, "trained")
        os.makedirs(cls.trained_dir)
        build.write_safetensors(os.path.join(cls.trained_dir, "model.safetensors"), trained)

        cls.delta = os.path.join(cls.tmp, "a", "delta.safetensors")
        cls.delta2 = os.path.join(cls.tmp, "b", "delta.safetensors")
        for out in (cls.delta, cls.delta2):
            start = time.perf_counter()
            status, cls.extract_out, err = run(
                "extract", "--base", BASE, "--trained", cls.trained_dir, "--out", out)
            cls.extract_s = time.perf_counter() - start
            assert status == 0, err
        cls.built = os.path.join(cls.tmp, "built")
        cls.built2 = os.path.join(cls.tmp, "built2")
        for out in (cls.built, cls.built2):
            start = time.perf_counter()
            status, _, err = run("assemble", "--base", BASE, "--delta", cls.delta, "--out", out)
            cls.assemble_s = time.perf_counter() - start
            assert status == 0, err
        values = sum(t.count for t in cls.perturbed.values())
        print(f"\nextract {cls.extract_s:.2f} s, assemble {cls.assemble_s:.2f} s for {values} changed values",
              file=sys.stderr)
        cls.assembled, cls.assembled_meta = build.read_safetensors(
            os.path.join(cls.built, "model.safetensors"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_delta_holds_exactly_the_changed_tensors_as_f16(self):
        delta, meta = build.read_safetensors(self.delta)
        self.assertEqual(meta, DELTA_META)  # no tensor stored whole
        self.assertEqual(sorted(delta), sorted(self.perturbed))
        self.assertEqual(len(delta), 32)  # 16 tensors in each of two layers
        for name, t in delta.items():
            self.assertEqual(t.dtype, "F16")
            self.assertEqual(t.shape, self.perturbed[name].shape)
        size = os.path.getsize(self.delta)
        print(f"\ndelta of encoder layers 4 and 5: {len(delta)} tensors, {size} bytes", file=sys.stderr)
        self.assertIn(f"{size} bytes", self.extract_out)

    def test_a_names_shapes_and_dtypes_are_the_base_ones(self):
        self.assertEqual(self.assembled_meta, {"format": "pt"})
        self.assertEqual(
            {k: (t.dtype, t.shape) for k, t in self.assembled.items()},
            {k: (t.dtype, t.shape) for k, t in self.base.items()},
        )

    def test_b_untouched_tensors_are_byte_identical(self):
        for name, t in self.base.items():
            if name not in self.perturbed:
                self.assertEqual(bytes(self.assembled[name].data), bytes(t.data), name)

    def test_c_changed_tensors_are_the_base_plus_the_f16_difference(self):
        worst = 0.0
        for name, t in self.perturbed.items():
            n = t.count
            trained = struct.unpack(f"<{n}f", t.data)
            base = struct.unpack(f"<{n}f", self.base[name].data)
            # f16(trained - base), the difference taken in float64; then f32(base + it).
            diff = struct.unpack(f"<{n}e", struct.pack(f"<{n}e", *[a - b for a, b in zip(trained, base)]))
            expected = f32([b + d for b, d in zip(base, diff)])
            got = self.assembled[name]
            self.assertEqual(got.dtype, "F32")
            self.assertEqual(bytes(got.data), expected, name)
            # and the built values are the trained ones but for f16's rounding of the change
            err = max(abs(a - b) for a, b in zip(struct.unpack(f"<{n}f", got.data), trained))
            self.assertLess(err, 1e-5, name)
            worst = max(worst, err)
        print(f"\nlargest error of a built value vs the trained one: {worst:.3g}", file=sys.stderr)

    def test_d_extract_is_deterministic(self):
        self.assertEqual(read(self.delta), read(self.delta2))

    def test_e_assemble_is_deterministic(self):
        a = read(os.path.join(self.built, "model.safetensors"))
        self.assertEqual(a, read(os.path.join(self.built2, "model.safetensors")))
        self.assertNotEqual(a, read(os.path.join(BASE, "model.safetensors")))

    def test_the_other_files_are_copied_unchanged(self):
        for name in ("config.json", "tokenizer.json", "vocab.txt", "1_Pooling/config.json", "NOTICE"):
            self.assertEqual(read(os.path.join(self.built, name)), read(os.path.join(BASE, name)), name)
        self.assertFalse(os.path.exists(os.path.join(self.built, "manifest.toml")))
        leftovers = [f for _, _, fs in os.walk(self.built) for f in fs if f.endswith(".part")]
        self.assertEqual(leftovers, [])

    def test_f_int8_rows_halve_the_delta_and_stay_within_half_a_scale(self):
        outs = [os.path.join(self.tmp, f"int8-{i}", "delta.safetensors") for i in (1, 2)]
        for out in outs:
            status, _, err = run("extract", "--int8", "--base", BASE, "--trained", self.trained_dir, "--out", out)
            self.assertEqual(status, 0, err)
        self.assertEqual(read(outs[0]), read(outs[1]))
        delta, meta = build.read_safetensors(outs[0])
        matrices = sorted(n for n, t in self.perturbed.items() if len(t.shape) == 2)
        self.assertEqual(meta, dict(DELTA_META, int8=",".join(matrices)))
        for name in self.perturbed:
            kind = ("I8", "F32") if name in matrices else ("F16", None)
            self.assertEqual((delta[name].dtype, delta.get(name + ":scale", build.Tensor(None, [], b"")).dtype),
                             kind, name)
        ratio = os.path.getsize(outs[0]) / os.path.getsize(self.delta)
        print(f"\nint8 rows: {ratio:.3f} of the float16 delta's size", file=sys.stderr)
        self.assertLess(ratio, 0.52)
        built = os.path.join(self.tmp, "int8-1", "built")
        status, _, err = run("assemble", "--base", BASE, "--delta", outs[0], "--out", built)
        self.assertEqual(status, 0, err)
        got, _ = build.read_safetensors(os.path.join(built, "model.safetensors"))
        for name, t in self.base.items():
            if name not in self.perturbed:
                self.assertEqual(bytes(got[name].data), bytes(t.data), name)
        for name in matrices:
            n, cols = self.perturbed[name].count, self.perturbed[name].shape[-1]
            trained = struct.unpack(f"<{n}f", self.perturbed[name].data)
            scales = delta[name + ":scale"].floats(name)
            values = struct.unpack(f"<{n}f", got[name].data)
            for i in range(0, n, 97):  # a sample: every value would take the test seconds
                bound = scales[i // cols] / 2 + 1e-7  # half a step, and f32's rounding of the sum
                self.assertLessEqual(abs(values[i] - trained[i]), bound, (name, i))

    def test_an_unchanged_model_gives_an_empty_delta_and_the_base_values(self):
        out = os.path.join(self.tmp, "empty", "delta.safetensors")
        status, _, err = run("extract", "--base", BASE, "--trained", BASE, "--out", out)
        self.assertEqual(status, 0, err)
        delta, meta = build.read_safetensors(out)
        self.assertEqual(delta, {})
        self.assertEqual(meta, DELTA_META)
        built = os.path.join(self.tmp, "empty", "built")
        status, _, err = run("assemble", "--base", BASE, "--delta", out, "--out", built)
        self.assertEqual(status, 0, err)
        got, _ = build.read_safetensors(os.path.join(built, "model.safetensors"))
        for name, t in self.base.items():
            if t.dtype == "F32":
                self.assertEqual(bytes(got[name].data), bytes(t.data), name)


class Tiny(unittest.TestCase):
    """Made-up models of a few floats: prefixes, errors, the header layout."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="decide-build-tiny-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def model(self, folder, tensors, files=True):
        d = os.path.join(self.tmp, folder)
        os.makedirs(d, exist_ok=True)
        build.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        if files:
            for name in ("config.json", "tokenizer.json"):
                with open(os.path.join(d, name), "w") as f:
                    f.write("{}\n")
        return d

    def test_a_prefixed_base_keeps_its_names(self):
        base = self.model("base", {
            "bert.encoder.w": build.Tensor("F32", [2], f32([1.0, 2.0])),
            "bert.embeddings.w": build.Tensor("F32", [1], f32([3.0])),
            "bert.embeddings.position_ids": build.Tensor("I64", [1, 2], struct.pack("<2q", 0, 1)),
        })
        trained = self.model("trained", {
            "encoder.w": build.Tensor("F32", [2], f32([1.0, 2.5])),
            "embeddings.w": build.Tensor("F32", [1], f32([3.0])),
            "embeddings.position_ids": build.Tensor("F32", [1, 2], f32([0.0, 1.0])),
        })
        delta = os.path.join(self.tmp, "d.safetensors")
        self.assertEqual(run("extract", "--base", base, "--trained", trained, "--out", delta)[0], 0)
        self.assertEqual(sorted(build.read_safetensors(delta)[0]), ["encoder.w"])
        # the difference from the base, not the value
        self.assertEqual(bytes(build.read_safetensors(delta)[0]["encoder.w"].data), struct.pack("<2e", 0.0, 0.5))
        out = os.path.join(self.tmp, "out")
        self.assertEqual(run("assemble", "--base", base, "--delta", delta, "--out", out)[0], 0)
        got, _ = build.read_safetensors(os.path.join(out, "model.safetensors"))
        self.assertEqual(sorted(got), sorted(build.read_safetensors(os.path.join(base, "model.safetensors"))[0]))
        self.assertEqual(bytes(got["bert.encoder.w"].data), f32([1.0, 2.5]))
        self.assertEqual(got["bert.embeddings.position_ids"].dtype, "I64")

    def test_the_header_is_sorted_compact_and_padded(self):
        path = os.path.join(self.tmp, "x.safetensors")
        build.write_safetensors(path, {
            "b": build.Tensor("F16", [1], struct.pack("<e", 1.0)),
            "a": build.Tensor("F32", [1], f32([2.0])),
        })
        raw = read(path)
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual(n % 8, 0)
        self.assertEqual(
            raw[8:8 + n].rstrip(b" "),
            b'{"__metadata__":{"format":"pt"},"a":{"data_offsets":[0,4],"dtype":"F32","shape":[1]},'
            b'"b":{"data_offsets":[4,6],"dtype":"F16","shape":[1]}}')
        self.assertEqual(raw[8 + n:], f32([2.0]) + struct.pack("<e", 1.0))

    def test_f16_rounds_to_nearest_even(self):
        # 1 + 2^-11 lies halfway between 1 and the next f16 (1 + 2^-10): ties go to even, 1.
        t = build.Tensor("F32", [2], f32([1 + 2**-11, 1 + 3 * 2**-11]))
        self.assertEqual(struct.unpack("<2e", build.to_f16(t, "t")), (1.0, 1 + 2 * 2**-10))
        # and so does the difference, taken exactly first: 1 + 2^-11 + 4 - 4.
        b = build.Tensor("F32", [2], f32([4.0, 4.0]))
        t = build.Tensor("F32", [2], f32([5 + 2**-11, 5 + 3 * 2**-11]))
        self.assertEqual(struct.unpack("<2e", build.f16_difference(t, b, "t")), (1.0, 1 + 2 * 2**-10))

    def test_the_difference_keeps_a_small_change_to_a_large_weight(self):
        # f16 values near 1000 are 0.5 apart: storing the value would lose the change entirely.
        big = [1000.0, -3.0, 0.25, 7.5]
        changed = [1000.0 + 2**-10, -3.0 + 1e-4, 0.25 - 3e-6, 7.5]
        base = self.model("base", {"encoder.w": build.Tensor("F32", [4], f32(big))})
        trained = self.model("trained", {"encoder.w": build.Tensor("F32", [4], f32(changed))})
        delta = os.path.join(self.tmp, "d.safetensors")
        self.assertEqual(run("extract", "--base", base, "--trained", trained, "--out", delta)[0], 0)
        out = os.path.join(self.tmp, "out")
        self.assertEqual(run("assemble", "--base", base, "--delta", delta, "--out", out)[0], 0)
        got = struct.unpack("<4f", build.read_safetensors(os.path.join(out, "model.safetensors"))[0]["encoder.w"].data)
        want = struct.unpack("<4f", f32(changed))
        self.assertEqual(got[0], want[0])  # 2^-10 is exact in f16, and 1000 + 2^-10 in f32
        for a, b in zip(got, want):
            self.assertLess(abs(a - b), 1e-7)

    def test_a_tensor_the_base_lacks_is_stored_whole_and_listed(self):
        base = self.model("base", {"encoder.w": build.Tensor("F32", [1], f32([1.0]))})
        trained = self.model("trained", {
            "encoder.w": build.Tensor("F32", [1], f32([1.5])),
            "head.b": build.Tensor("F32", [1], f32([0.1])),
            "head.a": build.Tensor("F32", [2], f32([2.0, -0.5])),
        })
        delta = os.path.join(self.tmp, "d.safetensors")
        self.assertEqual(run("extract", "--base", base, "--trained", trained, "--out", delta)[0], 0)
        tensors, meta = build.read_safetensors(delta)
        self.assertEqual(meta, dict(DELTA_META, whole="head.a,head.b"))
        self.assertEqual(bytes(tensors["head.b"].data), struct.pack("<e", 0.1))
        self.assertEqual(bytes(tensors["encoder.w"].data), struct.pack("<e", 0.5))
        out = os.path.join(self.tmp, "out")
        self.assertEqual(run("assemble", "--base", base, "--delta", delta, "--out", out)[0], 0)
        got, _ = build.read_safetensors(os.path.join(out, "model.safetensors"))
        self.assertEqual(bytes(got["encoder.w"].data), f32([1.5]))
        self.assertEqual(bytes(got["head.a"].data), f32([2.0, -0.5]))
        self.assertEqual(bytes(got["head.b"].data), f32(struct.unpack("<e", struct.pack("<e", 0.1))))

    def test_int8_rows_round_each_row_to_its_own_scale(self):
        w = [0.25, -1.0, 2.0, 3.0, 4.0, 5.0]
        base = self.model("base", {
            "encoder.w": build.Tensor("F32", [2, 3], f32(w)),
            "encoder.b": build.Tensor("F32", [2], f32([1.0, 1.0])),
        })
        # Row 0 changes by (0.5, -0.25, 0.1); row 1 not at all; the vector by 0.5.
        trained_w = [0.75, -1.25, 2.1, 3.0, 4.0, 5.0]
        trained = self.model("trained", {
            "encoder.w": build.Tensor("F32", [2, 3], f32(trained_w)),
            "encoder.b": build.Tensor("F32", [2], f32([1.5, 1.0])),
        })
        delta = os.path.join(self.tmp, "d.safetensors")
        status, out, err = run("extract", "--int8", "--base", base, "--trained", trained, "--out", delta)
        self.assertEqual(status, 0, err)
        self.assertIn("1 int8", out)
        tensors, meta = build.read_safetensors(delta)
        self.assertEqual(meta, dict(DELTA_META, int8="encoder.w"))
        self.assertEqual(sorted(tensors), ["encoder.b", "encoder.w", "encoder.w:scale"])
        self.assertEqual(bytes(tensors["encoder.b"].data), struct.pack("<2e", 0.5, 0.0))
        (scale,) = struct.unpack("<f", struct.pack("<f", 0.5 / 127))
        self.assertEqual(tensors["encoder.w:scale"].floats("s"), (scale, 0.0))
        q = struct.unpack("<6b", tensors["encoder.w"].data)
        # The largest change is ±127; the others round to nearest, the change taken from the
        # float32 values (2.1 - 2.0 is not exactly 0.1).
        d = [a - b for a, b in zip(struct.unpack("<3f", f32(trained_w[:3])), w[:3])]
        self.assertEqual(q, (127, round(d[1] / scale), round(d[2] / scale), 0, 0, 0))
        self.assertEqual(q[1], -64)
        built = os.path.join(self.tmp, "out")
        self.assertEqual(run("assemble", "--base", base, "--delta", delta, "--out", built)[0], 0)
        got, _ = build.read_safetensors(os.path.join(built, "model.safetensors"))
        self.assertEqual(bytes(got["encoder.w"].data), f32([b + v * scale for b, v in zip(w[:3], q[:3])] + w[3:]))
        self.assertEqual(bytes(got["encoder.b"].data), f32([1.5, 1.0]))

    def test_int8_rows_need_their_scales(self):
        base = self.model("base", {"encoder.w": build.Tensor("F32", [2, 2], f32([1.0, 2.0, 3.0, 4.0]))})
        meta = dict(DELTA_META, int8="encoder.w")
        q = build.Tensor("I8", [2, 2], struct.pack("<4b", 1, 2, 3, 4))
        for tensors, expect in (
            ({"encoder.w": q}, "encoder.w:scale"),
            ({"encoder.w": q, "encoder.w:scale": build.Tensor("F32", [4], f32([1, 1, 1, 1]))}, "one scale a row"),
            ({"encoder.w": build.Tensor("F16", [2, 2], struct.pack("<4e", 1, 2, 3, 4)),
              "encoder.w:scale": build.Tensor("F32", [2], f32([1, 1]))}, "listed as int8 rows"),
        ):
            delta = os.path.join(self.tmp, "d.safetensors")
            build.write_safetensors(delta, tensors, meta)
            status, _, err = run("assemble", "--base", base, "--delta", delta, "--out", os.path.join(self.tmp, "o"))
            self.assertEqual((status, err.count("\n")), (2, 1), err)
            self.assertIn(expect, err)

    def test_a_non_finite_change_is_refused_in_int8(self):
        base = self.model("base", {"encoder.w": build.Tensor("F32", [1, 2], f32([1.0, 2.0]))})
        trained = self.model("trained", {"encoder.w": build.Tensor("F32", [1, 2], f32([1.0, float("inf")]))})
        status, _, err = run("extract", "--int8", "--base", base, "--trained", trained,
                             "--out", os.path.join(self.tmp, "d.safetensors"))
        self.assertEqual((status, err.count("\n")), (2, 1), err)
        self.assertIn("encoder.w", err)
        self.assertIn("not finite", err)

    def test_a_delta_of_values_is_refused(self):
        base = self.model("base", {"encoder.w": build.Tensor("F32", [1], f32([1.0]))})
        delta = os.path.join(self.tmp, "d.safetensors")
        build.write_safetensors(delta, {"encoder.w": build.Tensor("F16", [1], struct.pack("<e", 1.5))})
        status, _, err = run("assemble", "--base", base, "--delta", delta, "--out", os.path.join(self.tmp, "o"))
        self.assertEqual((status, err.count("\n")), (2, 1), err)
        self.assertIn(delta, err)
        self.assertIn("difference", err)

    def test_a_shape_mismatch_is_one_line_naming_the_tensor(self):
        base = self.model("base", {"encoder.w": build.Tensor("F32", [2], f32([1.0, 2.0]))})
        delta = os.path.join(self.tmp, "d.safetensors")
        build.write_safetensors(
            delta, {"encoder.w": build.Tensor("F16", [3], struct.pack("<3e", 1, 2, 3))}, DELTA_META)
        status, _, err = run("assemble", "--base", base, "--delta", delta, "--out", os.path.join(self.tmp, "o"))
        self.assertEqual(status, 2)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("encoder.w", err)
        self.assertIn("shape", err)

    def test_missing_and_corrupt_files_are_one_line_naming_the_file(self):
        base = self.model("base", {"encoder.w": build.Tensor("F32", [2], f32([1.0, 2.0]))})
        missing = os.path.join(self.tmp, "nope.safetensors")
        status, _, err = run("assemble", "--base", base, "--delta", missing, "--out", os.path.join(self.tmp, "o"))
        self.assertEqual((status, err.count("\n")), (2, 1), err)
        self.assertIn(missing, err)
        weights = os.path.join(base, "model.safetensors")
        with open(weights, "r+b") as f:
            f.truncate(os.path.getsize(weights) - 3)
        status, _, err = run("extract", "--base", base, "--trained", base, "--out", os.path.join(self.tmp, "d"))
        self.assertEqual((status, err.count("\n")), (2, 1), err)
        self.assertIn(weights, err)
        with open(weights, "wb") as f:
            f.write(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
        status, _, err = run("extract", "--base", base, "--trained", base, "--out", os.path.join(self.tmp, "d"))
        self.assertEqual((status, err.count("\n")), (2, 1), err)
        self.assertIn(weights, err)

    def test_the_script_runs_from_the_command_line(self):
        r = subprocess.run([sys.executable, os.path.join(HERE, "build.py"), "extract", "--base",
                            os.path.join(self.tmp, "no-such-dir"), "--trained", self.tmp, "--out",
                            os.path.join(self.tmp, "d")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no-such-dir", r.stderr)


if __name__ == "__main__":
    unittest.main()
