"""GPU variant paths on a real GPU, through infaas's own code.

What it exercises: GPU detection (`profiler.machine.local_machine`, `variants.plan.OrtProviderProbe`
in a fresh process as infaas runs it, then in this one), the plan's GPU branch
(`variants.plan.plan_variants`), the generator (`variants.generator.generate`: ONNX CUDA fp32 and
fp16 via `variants.converters.fp16`, parity against the reference), the ONNX Runtime loader
(`variants.runtimes.onnxruntime`: `providers_for`, the refusal to run a GPU variant on CPU) and the
guarded TensorRT converter and runtime (`variants.converters.tensorrt`, `variants.runtimes.tensorrt`).

Two models trained here on scikit-learn's digits (nothing is downloaded): a small scikit-learn MLP
registered as kind "sklearn" (skl2onnx converts it) and a wide MLP written as ONNX with onnx.helper
from trained weights, registered as kind "onnx". For each variant built: where ORT placed its nodes
(a profiling session), top-1 agreement and max |Δ| against the CPU fp32 variant, and p50 latency per
batch size measured with the profiler's own loop (`profiler.harness.measure_point`).

Without a usable GPU it runs the CPU side, says so and what it would exercise, and exits 0
(1 under --require-gpu). Any failed check exits 1. On a GPU machine the pass/fail of detection is
infaas's OrtProviderProbe as shipped, run in a fresh process with nothing patched: it must find
CUDAExecutionProvider. If this onnxruntime refuses the probe's own model (OrtProviderProbe.probe_model;
before the fix on main it was written at onnx's default IR 14, which onnxruntime 1.31 refuses), that is
a failed check too, and only then does the rest of the run pin the probe model's IR to 9 so the GPU
paths behind it are still checked.
If CUDA's libraries are not on the loader's path, pip's nvidia/* folders are preloaded
(--cuda-libs). Writes gpu_check.{md,json,log} to --out (default: $OUT when set).

    scripts/gpu_check [--require-gpu] [--quick] [--out DIR] [--cuda-libs auto|none|DIR] [--width N]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from infaas.types import ModelKind
    from variants.plan import HardwareInfo

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
BATCHES = (1, 8, 32, 128, 512)
CUDA_OPTION_KEYS = (
    "device_id",
    "use_tf32",
    "cudnn_conv_algo_search",
    "arena_extend_strategy",
    "gpu_mem_limit",
    "do_copy_in_default_stream",
    "enable_cuda_graph",
)
COMPUTE_OPS = {"MatMul", "Gemm", "FusedGemm", "FusedMatMul", "MatMulInteger", "QLinearMatMul"}
WOULD_EXERCISE = """\
On a machine where an ONNX Runtime session really runs on CUDA this check also:
  - plans and builds onnx-gpu-fp32-t1 and onnx-gpu-fp16-t1 for both models through
    variants.generator.generate (fp16 via variants.converters.fp16.to_fp16) and checks parity;
  - loads them with variants.runtimes.load_variant and asserts session.get_providers()[0] is
    CUDAExecutionProvider and that a profiling session placed the graph's nodes on CUDA;
  - compares their predictions with the CPU fp32 variant (top-1 agreement, max |diff|);
  - times p50 per batch size (1..512) for the CPU and CUDA variants with profiler.harness;
  - checks that TensorRT, when its libraries are absent, is skipped by the plan and refused by
    variants.runtimes.tensorrt with a reason."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, ok, detail))
        self.say(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))
        return ok


@contextlib.contextmanager
def captured_fds() -> Iterator[list[str]]:
    """Capture what C++ (ORT's logger) and Python print to fds 1 and 2 inside the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    lines: list[str] = []
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield lines
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def _clean(line: str) -> str:
    """One ORT log line without colour codes; a library load failure keeps its cause."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
    if "Failed to load library" in text:
        text = text[text.index("Failed to load library") :]
    return text


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except Exception as exc:  # a missing or broken package is reported, not fatal
        return f"missing ({type(exc).__name__})"
    return str(getattr(mod, "__version__", "?"))


def _nvidia_smi() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return out.strip().splitlines()[0] if out.strip() else None


PIN_IR = """
from onnx import helper
_make_model = helper.make_model
def _pinned(*args, **kwargs):
    model = _make_model(*args, **kwargs)
    model.ir_version = 9  # what ONNX Runtime 1.31 loads (it refuses IR > 13; onnx 1.23 writes 14)
    return model
helper.make_model = _pinned
"""


@contextlib.contextmanager
def pinned_ir() -> Iterator[None]:
    """Within the block, onnx.helper.make_model writes IR 9: the one change that lets infaas's
    OrtProviderProbe build a model this onnxruntime accepts (see probe_model_error)."""
    from onnx import helper

    original = helper.make_model

    def pinned(*args: Any, **kwargs: Any) -> Any:
        model = original(*args, **kwargs)
        model.ir_version = 9
        return model

    helper.make_model = pinned
    try:
        yield
    finally:
        helper.make_model = original


def probe_model_error() -> str | None:
    """Why a CPU session cannot load the model OrtProviderProbe builds (None: it loads).

    The probe swallows every session error as "provider absent", so a model this onnxruntime refuses
    makes every accelerator look absent. The model is infaas's own (OrtProviderProbe.probe_model)."""
    import onnx
    import onnxruntime as ort

    from variants.plan import OrtProviderProbe

    payload = OrtProviderProbe.probe_model()
    ir_version = onnx.load_model_from_string(payload).ir_version
    try:
        ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's errors are untyped
        text = str(exc).strip()
        start = text.find("Unsupported")
        return f"IR {ir_version}: " + (text[start:] if start >= 0 else text[-160:])
    return None


def probe_in_fresh_process(pin_ir: bool) -> tuple[list[str], str]:
    """OrtProviderProbe as infaas runs it: a new interpreter, nothing preloaded (optionally with
    the probe model's IR version pinned)."""
    code = (
        (PIN_IR if pin_ir else "")
        + "import json\nfrom variants.plan import OrtProviderProbe\n"
        + "print('PROVIDERS=' + json.dumps(sorted(OrtProviderProbe().session_providers())))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env
    )
    providers: list[str] = []
    for line in proc.stdout.splitlines():
        if line.startswith("PROVIDERS="):
            providers = list(json.loads(line.removeprefix("PROVIDERS=")))
    noise = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln and not ln.startswith("PROVIDERS=")]
    return providers, "\n".join(noise[-12:])


def nvidia_lib_dirs() -> list[Path]:
    """Folders of pip-installed CUDA / cuDNN libraries (nvidia/cu13/lib, nvidia/cudnn/lib, ...)."""
    found: list[Path] = []
    for entry in sys.path:
        for pattern in ("nvidia/cu*/lib", "nvidia/cudnn/lib", "nvidia/*/lib"):
            for hit in sorted(glob.glob(os.path.join(entry or ".", pattern))):
                path = Path(hit).resolve()
                if path.is_dir() and path not in found:
                    found.append(path)
    return found


def preload_cuda(spec: str, report: Report) -> list[str]:
    """Load the CUDA libraries ORT's CUDA provider needs from pip's nvidia packages (infaas itself
    never does: it relies on the dynamic loader's default paths)."""
    import onnxruntime as ort

    dirs = nvidia_lib_dirs() if spec == "auto" else [Path(spec)]
    loaded: list[str] = []
    for folder in dirs:
        names = sorted(p.name for p in folder.glob("lib*.so*"))
        has_cuda = any(n.startswith(("libcudart.so", "libcublas.so")) for n in names)
        has_cudnn = any(n.startswith("libcudnn.so") for n in names)
        if not (has_cuda or has_cudnn):
            continue
        preload = getattr(ort, "preload_dlls", None)
        with captured_fds() as noise:
            if preload is not None:
                preload(cuda=has_cuda, cudnn=has_cudnn, msvc=False, directory=str(folder))
            else:
                for name in names:
                    with contextlib.suppress(OSError):
                        ctypes.CDLL(str(folder / name), mode=ctypes.RTLD_GLOBAL)
        loaded.append(str(folder))
        report.say(f"  preloaded from {folder} (cuda={has_cuda}, cudnn={has_cudnn})")
        for line in noise[-4:]:
            report.say(f"    | {line}")
    return loaded


# --------------------------------------------------------------------------- models


@dataclass
class Model:
    arch: str
    kind: ModelKind  # "sklearn" or "onnx" here
    path: Path
    accuracy: float


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.4, random_state=0, stratify=y)
    return x_train, x_val, y_train, y_val


def _mlp(hidden: tuple[int, ...], max_iter: int, x: np.ndarray, y: np.ndarray) -> Any:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=hidden, max_iter=max_iter, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    return clf


def onnx_mlp(coefs: list[np.ndarray], intercepts: list[np.ndarray], path: Path) -> Path:
    """MatMul + Add (+ Relu) per layer, Softmax at the end: the trained MLP written with onnx.helper."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []
    inits: list[Any] = []
    cur = "x"
    for i, (w, b) in enumerate(zip(coefs, intercepts, strict=True)):
        inits += [
            numpy_helper.from_array(np.asarray(w, np.float32), f"w{i}"),
            numpy_helper.from_array(np.asarray(b, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [cur, f"w{i}"], [f"mm{i}"]),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"]),
        ]
        cur = f"z{i}"
        if i < len(coefs) - 1:
            nodes.append(helper.make_node("Relu", [cur], [f"h{i}"]))
            cur = f"h{i}"
    nodes.append(helper.make_node("Softmax", [cur], ["probabilities"], axis=-1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", coefs[0].shape[0]])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", coefs[-1].shape[1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="gpu_check")
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def build_models(work: Path, width: int, wide_iters: int, report: Report) -> tuple[list[Model], np.ndarray]:
    import joblib

    x_train, x_val, y_train, y_val = digits()
    t0 = time.perf_counter()
    small = _mlp((64,), 300, x_train, y_train)
    joblib.dump(small, work / "digits-mlp-sk.joblib")
    wide = _mlp((width, width), wide_iters, x_train, y_train)
    onnx_path = onnx_mlp(list(wide.coefs_), list(wide.intercepts_), work / "digits-mlp-wide.onnx")
    report.say(
        f"trained on digits ({len(x_train)} train / {len(x_val)} validation rows) in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    models = [
        Model("digits-mlp-sk", "sklearn", work / "digits-mlp-sk.joblib", float(small.score(x_val, y_val))),
        Model(f"digits-mlp-wide{width}", "onnx", onnx_path, float(wide.score(x_val, y_val))),
    ]
    # The hand-written graph must compute what the estimator does.
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (probs,) = sess.run(["probabilities"], {"x": x_val})
    diff = float(np.max(np.abs(probs - wide.predict_proba(x_val))))
    report.check("onnx.helper MLP = scikit-learn's predict_proba", diff < 1e-4, f"max |diff| {diff:.2e}")
    return models, x_val


# --------------------------------------------------------------------------- checks


def node_placement(path: Path, providers: list[str], x: np.ndarray, work: Path) -> dict[str, list[str]]:
    """Which provider ran each node: a profiling session with infaas's own session options."""
    import onnxruntime as ort

    from variants.runtimes.onnxruntime import session_options

    opts = session_options(1)
    opts.enable_profiling = True
    opts.profile_file_prefix = str(work / "prof")
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
    sess.run(None, {sess.get_inputs()[0].name: x})
    events = json.loads(Path(sess.end_profiling()).read_text())
    placed: dict[str, set[str]] = {}
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            args = event.get("args", {})
            node = str(event["name"]).removesuffix("_kernel_time")
            placed.setdefault(str(args.get("provider", "?")), set()).add(f"{args.get('op_name', '?')}:{node}")
    return {provider: sorted(nodes) for provider, nodes in placed.items()}


def fp16_summary(path: Path) -> tuple[int, int, list[str]]:
    """(fp16 initializers, all float initializers, graph I/O element types) of an artifact."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(path))
    floats = [i for i in model.graph.initializer if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)]
    halves = sum(1 for i in floats if i.data_type == TensorProto.FLOAT16)
    io = [
        TensorProto.DataType.Name(v.type.tensor_type.elem_type)
        for v in (*model.graph.input, *model.graph.output)
    ]
    return halves, len(floats), io


def time_variant(
    predict: Callable[[np.ndarray], np.ndarray], x: np.ndarray, max_batch: int, quick: bool
) -> dict[int, float]:
    from profiler.harness import MeasureConfig, batch_sizes, make_batch, measure_point

    config = MeasureConfig.quick() if quick else MeasureConfig.normal()
    out: dict[int, float] = {}
    for batch in batch_sizes(max_batch, BATCHES):
        inputs = make_batch(x, batch)
        for _ in range(max(config.warmup_iterations, 3)):
            predict(inputs)
        out[batch] = measure_point(predict, inputs, config.rule(), time.perf_counter).p50_ms
    return out


def check_model(
    model: Model, x_val: np.ndarray, hw: HardwareInfo, work: Path, quick: bool, report: Report
) -> list[dict[str, Any]]:
    from variants.artifacts import Staging
    from variants.generator import generate
    from variants.plan import plan_variants
    from variants.reference import load_reference, predict_in_batches
    from variants.runtimes import artifact_path, load_variant
    from variants.runtimes.onnxruntime import OnnxLoadedModel, providers_for

    report.say(f"\n== {model.arch} (kind {model.kind}, accuracy {model.accuracy:.4f})")
    reference = load_reference(model.kind, model.path)
    ref_probs = predict_in_batches(reference.predict, x_val, 128)
    staging = Staging(work / model.arch / "artifacts", work / model.arch / "tmp")
    plan = plan_variants(model.arch, model.kind, hw)
    report.say("planned: " + ", ".join(p.spec.name.split("/")[1] for p in plan.variants))
    t0 = time.perf_counter()
    result = generate(
        architecture=model.arch,
        kind=model.kind,
        source=model.path,
        reference=reference,
        input_shape=(x_val.shape[1],),
        validation_x=x_val,
        reference_probs=ref_probs,
        hardware=hw,
        staging=staging,
        now_s=time.time(),
        plan=plan,
    )
    report.say(
        f"generate: {len(result.variants)} built, {len(result.skipped)} skipped in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    for skip in result.skipped:
        report.say(f"  skipped {skip.name.split('/')[1]}: {skip.reason}")
    built = {v.spec.name.split("/")[1]: v for v in result.variants}
    skipped = {s.name.split("/")[1]: s.reason for s in result.skipped}

    gpu_names = ("onnx-gpu-fp32-t1", "onnx-gpu-fp16-t1")
    trt_names = ("trt-gpu-fp32-t1", "trt-gpu-fp16-t1")
    if hw.cuda:
        for name in gpu_names:
            report.check(f"{model.arch}: {name} built, parity passed", name in built, skipped.get(name, ""))
    else:
        for name in gpu_names:
            reason = skipped.get(name, "")
            report.check(f"{model.arch}: {name} skipped with a reason (no CUDA)", CUDA in reason, reason)
    if not hw.tensorrt:
        for name in trt_names:
            reason = skipped.get(name, "")
            report.check(f"{model.arch}: {name} skipped with a reason (no TensorRT)", TRT in reason, reason)

    fp32_name = "onnx-cpu-fp32-t1"
    if fp32_name not in built:
        report.check(f"{model.arch}: CPU fp32 variant built", False, skipped.get(fp32_name, "absent"))
        return []
    fp32_loaded = load_variant(built[fp32_name], staging.artifacts_dir)
    cpu_probs = predict_in_batches(fp32_loaded.predict, x_val, 128)
    fp32_loaded.close()

    rows: list[dict[str, Any]] = []
    for name, variant in built.items():
        if variant.spec.threads != 1:
            continue  # t2 differs from t1 only in threads: same artifact, same numbers
        path = artifact_path(variant, staging.artifacts_dir)
        row: dict[str, Any] = {
            "model": model.arch,
            "variant": name,
            "parity_top1": variant.parity.top1_agreement,
            "parity_max_abs_diff": variant.parity.max_abs_diff,
        }
        loaded = load_variant(variant, staging.artifacts_dir)
        try:
            if isinstance(loaded, OnnxLoadedModel):
                session_providers = loaded.providers
                row["session_providers"] = session_providers
                placement = node_placement(path, providers_for(variant), x_val[:8], work)
                row["placement"] = {k: len(v) for k, v in placement.items()}
                if variant.spec.hardware == "gpu":
                    options = loaded.session.get_provider_options().get(CUDA, {})
                    row["cuda_options"] = {k: options[k] for k in CUDA_OPTION_KEYS if k in options}
                    report.say(f"  {name} CUDA provider options in effect: {row['cuda_options']}")
                    on_cpu = placement.get("CPUExecutionProvider", [])
                    compute_on_cpu = [n for n in on_cpu if n.split(":")[0] in COMPUTE_OPS]
                    report.check(
                        f"{model.arch}: {name} session runs on CUDA",
                        session_providers[:1] == [CUDA],
                        f"get_providers() = {session_providers}",
                    )
                    report.check(
                        f"{model.arch}: {name} MatMul/Gemm nodes placed on CUDA",
                        len(placement.get(CUDA, [])) > 0 and not compute_on_cpu,
                        f"{ {k: len(v) for k, v in placement.items()} }"
                        + (f"; on CPU: {on_cpu}" if on_cpu else ""),
                    )
            if variant.spec.precision == "fp16":
                halves, floats, io = fp16_summary(path)
                row["fp16_initializers"] = f"{halves}/{floats}"
                report.check(
                    f"{model.arch}: {name} artifact is fp16 inside, float32 at its edges",
                    halves == floats > 0 and "FLOAT16" not in io,
                    f"{halves}/{floats} float initializers fp16; graph I/O {io}",
                )
            probs = predict_in_batches(loaded.predict, x_val, variant.spec.max_batch)
            row["agree_vs_cpu_fp32"] = float(np.mean(np.argmax(probs, 1) == np.argmax(cpu_probs, 1)))
            row["max_abs_diff_vs_cpu_fp32"] = float(np.max(np.abs(probs - cpu_probs)))
            row["p50_ms"] = time_variant(loaded.predict, x_val, variant.spec.max_batch, quick)
        finally:
            loaded.close()
        rows.append(row)
        p50 = " ".join(f"b{b}={ms:.3f}" for b, ms in row["p50_ms"].items())
        report.say(
            f"  {name:18s} top1 vs cpu-fp32 {row['agree_vs_cpu_fp32']:.4f}  max|Δ| "
            f"{row['max_abs_diff_vs_cpu_fp32']:.2e}  p50 ms {p50}"
        )
    tensorrt_paths(model, built, staging.artifacts_dir, hw, work, report)
    return rows


def tensorrt_paths(
    model: Model, built: dict[str, Any], artifacts: Path, hw: HardwareInfo, work: Path, report: Report
) -> None:
    """The guarded TensorRT converter and runtime, called directly (the plan skips them)."""
    from infaas.errors import Unavailable
    from infaas.types import Parity, Variant, VariantSpec
    from variants.converters.tensorrt import TensorRTUnavailable, prepare_tensorrt
    from variants.plan import GPU_MAX_BATCH as MAX_GPU
    from variants.runtimes import artifact_path
    from variants.runtimes.onnxruntime import OnnxRuntime
    from variants.runtimes.tensorrt import TensorRTRuntime

    fp32 = artifact_path(built["onnx-cpu-fp32-t1"], artifacts)
    try:
        prepare_tensorrt(fp32, work / model.arch / "trt" / "model.trt.onnx", hw.providers)
        converter = "prepared (TensorRT reported present)"
    except TensorRTUnavailable as exc:
        converter = f"TensorRTUnavailable: {exc}"
    report.say(f"  prepare_tensorrt: {converter}")

    stub = Parity(top1_agreement=1.0, max_abs_diff=0.0, samples=1)
    trt = Variant(
        spec=VariantSpec(architecture=model.arch, runtime="tensorrt", hardware="gpu", max_batch=MAX_GPU),
        artifact="",
        sha256="",
        parity=stub,
    )
    copy = work / model.arch / "trt-load" / "model.onnx"
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fp32, copy)
    refused: str | None = None
    with captured_fds() as noise:
        try:
            TensorRTRuntime().load(trt, copy).close()
        except Unavailable as exc:
            refused = str(exc)
    keys = ("nvinfer", "TensorRT", "EP Error", "libnv")
    cause = [_clean(ln) for ln in noise if any(k in ln for k in keys)]
    report.say(f"  TensorRTRuntime.load: {refused or 'loaded on TensorRT'}")
    for line in cause[:4]:
        report.say(f"    ORT said: {line[:300]}")
    report.data.setdefault("tensorrt", {})[model.arch] = {
        "converter": converter,
        "runtime": refused,
        "ort_output": cause[:8],
    }
    if not hw.tensorrt:
        report.check(f"{model.arch}: TensorRT converter refuses with a reason", TRT in converter, converter)
        report.check(f"{model.arch}: TensorRT runtime refuses (Unavailable)", bool(refused), refused or "")
    if not hw.cuda:
        # The guard against ORT's silent CPU fallback: a GPU variant must not load on CPU.
        gpu = Variant(
            spec=trt.spec.model_copy(update={"runtime": "onnxruntime"}), artifact="", sha256="", parity=stub
        )
        try:
            OnnxRuntime().load(gpu, copy).close()
            report.check(f"{model.arch}: GPU variant refused on a CPU-only session", False, "it loaded")
        except Unavailable as exc:
            report.check(f"{model.arch}: GPU variant refused on a CPU-only session", True, str(exc))


# --------------------------------------------------------------------------- output


def markdown(report: Report, rows: list[dict[str, Any]]) -> str:
    out = ["# gpu_check", ""]
    for key, value in report.data.get("env", {}).items():
        out.append(f"- {key}: {value}")
    out += [
        "",
        "| model | variant | top-1 vs CPU fp32 | max abs diff vs CPU fp32 | nodes by provider | "
        + " | ".join(f"p50 b={b} (ms)" for b in BATCHES)
        + " |",
        "|---|---|---:|---:|---|" + "---:|" * len(BATCHES),
    ]
    for row in rows:
        placed = row.get("placement", {}).items()
        placement = ", ".join(f"{k.removesuffix('ExecutionProvider')} {v}" for k, v in placed)
        cells = [f"{row['p50_ms'][b]:.3f}" if b in row["p50_ms"] else "—" for b in BATCHES]
        out.append(
            f"| {row['model']} | {row['variant']} | {row['agree_vs_cpu_fp32']:.4f} | "
            f"{row['max_abs_diff_vs_cpu_fp32']:.2e} | {placement or '—'} | " + " | ".join(cells) + " |"
        )
    out += ["", "## checks", ""]
    for c in report.checks:
        out.append(f"- {'PASS' if c.ok else 'FAIL'} {c.name}" + (f": {c.detail}" if c.detail else ""))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-gpu", action="store_true", help="fail when no CUDA session is possible")
    parser.add_argument("--quick", action="store_true", help="short timing windows, narrower wide model")
    default_out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=default_out, help="folder for gpu_check.{md,json,log}")
    parser.add_argument(
        "--cuda-libs",
        default="auto",
        help="where to preload CUDA libraries from if infaas's probe finds no CUDA: "
        "auto (pip's nvidia/* folders on sys.path), none, or a folder",
    )
    parser.add_argument("--width", type=int, default=None, help="hidden width of the wide MLP")
    args = parser.parse_args(argv)
    width = args.width or (256 if args.quick else 1024)
    report = Report()
    started = time.perf_counter()

    from profiler.machine import local_machine

    machine = local_machine()
    import onnxruntime as ort

    env = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "nvidia-smi": _nvidia_smi() or "not found",
        "local_machine()": f"cpu {machine.cpu_model!r}, {machine.cores} cores, gpu {machine.gpu!r}",
        "onnxruntime": f"{ort.__version__} {ort.get_device()} ({Path(ort.__file__).parent})",
        "get_available_providers()": ", ".join(ort.get_available_providers()),
        "versions": ", ".join(f"{m} {_version(m)}" for m in ("numpy", "onnx", "sklearn", "skl2onnx")),
    }
    report.data["env"] = env
    report.say("== environment")
    for key, value in env.items():
        report.say(f"{key}: {value}")

    as_is, noise = probe_in_fresh_process(pin_ir=False)
    report.say(f"OrtProviderProbe in a fresh process (as infaas runs it): {as_is}")
    for line in noise.splitlines()[-6:]:
        report.say(f"  | {line[:240]}")
    env["OrtProviderProbe, fresh process"] = str(as_is)
    if machine.gpu:
        # The pass/fail of GPU detection: the shipped probe, unpatched, in a fresh process.
        report.check(
            "infaas's OrtProviderProbe, unpatched, in a fresh process finds CUDAExecutionProvider",
            CUDA in as_is,
            str(as_is),
        )
    model_error = probe_model_error()
    env["probe model loads in this onnxruntime"] = "yes" if model_error is None else f"NO ({model_error})"
    report.say(f"the probe's model loads in this onnxruntime: {env['probe model loads in this onnxruntime']}")
    if model_error is not None and machine.gpu:
        report.check(
            "infaas's OrtProviderProbe can detect an accelerator here (variants/plan.py)",
            False,
            f"every probe session fails ({model_error}) and the probe takes that for 'provider absent': "
            "GPU variants are never planned. The rest of this run pins the probe model's IR to 9.",
        )
    pin = model_error is not None
    if pin:
        pinned, noise = probe_in_fresh_process(pin_ir=True)
        report.say(f"OrtProviderProbe in a fresh process, probe model pinned to IR 9: {pinned}")
        env["OrtProviderProbe, fresh process, IR pinned"] = str(pinned)
        as_is = pinned
    if CUDA not in as_is and args.cuda_libs != "none" and machine.gpu:
        report.say("CUDA not found with the default library paths; preloading pip's CUDA libraries:")
        env["preloaded"] = ", ".join(preload_cuda(args.cuda_libs, report)) or "nothing found"

    from variants.plan import OrtProviderProbe, detect_hardware

    with captured_fds() as probe_noise, pinned_ir() if pin else contextlib.nullcontext():
        hw = detect_hardware(OrtProviderProbe())
    report.say(
        f"detect_hardware(OrtProviderProbe()) here{' (IR pinned)' if pin else ''}: {sorted(hw.providers)} "
        f"(cuda={hw.cuda}, tensorrt={hw.tensorrt})"
    )
    for line in [ln for ln in probe_noise if ln.strip()][:4]:
        report.say(f"  | {_clean(line)[:240]}")
    env["detect_hardware" + (" (IR pinned)" if pin else "")] = f"{sorted(hw.providers)}"
    if args.require_gpu:
        report.check("a GPU is visible (local_machine().gpu)", machine.gpu is not None, str(machine.gpu))
        report.check("an ONNX Runtime session really runs on CUDA", hw.cuda, str(sorted(hw.providers)))
    if not hw.cuda:
        report.say(
            f"\nNO USABLE GPU here (nvidia-smi: {env['nvidia-smi']}; sessions run on "
            f"{sorted(hw.providers)}). Running the CPU side only."
        )
        report.say(WOULD_EXERCISE)

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = Path(tmp)
        models, x_val = build_models(work, width, 8 if args.quick else 20, report)
        for model in models:
            try:
                rows += check_model(model, x_val, hw, work, args.quick, report)
            except Exception:  # report and go on with the next model
                report.check(f"{model.arch}: checks ran to the end", False, traceback.format_exc()[-1500:])

    report.data["rows"] = rows
    report.data["checks"] = [c.__dict__ for c in report.checks]
    report.data["wall_s"] = round(time.perf_counter() - started, 1)
    failed = [c for c in report.checks if not c.ok]
    report.say(
        f"\n{len(report.checks) - len(failed)}/{len(report.checks)} checks passed in "
        f"{report.data['wall_s']} s" + ("" if hw.cuda else " (CPU side only: no CUDA session)")
    )
    text = markdown(report, rows)
    print("\n" + text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.md").write_text(text)
        (args.out / "gpu_check.json").write_text(json.dumps(report.data, indent=1, default=str))
        (args.out / "gpu_check.log").write_text("\n".join(report.lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
