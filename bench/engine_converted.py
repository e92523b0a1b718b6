"""CTranslate2 and OpenVINO for bench_engines.py: converted here (ct2-transformers-converter;
optimum-intel's export in a venv of its own), timed in child processes (child_engine.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from common import HERE, child_failure, last_json
from engine_util import Unavailable, fresh, log, row, run_logged

OPTIMUM_INTEL = "2.2.0"
CT2_TYPES = {"int8_float32": "int8", "float32": "fp32"}
# (label, tblock format it is set against, export's --weight-format and options, precision hint)
OV_CONFIGS = [("fp32, f32 hint", "fp32", ("fp32",), "f32"),
              ("fp32, bf16 hint", "bf16", ("fp32",), "bf16"),
              ("int8 weights (nncf), default hint", "int8", ("int8",), "default"),
              ("int4 weights (nncf sym g32), default hint", "int4",
               ("int4", "--sym", "--group-size", "32", "--ratio", "1.0"), "default")]


def child_rows(ctx, engine: str, model: Path, config: str, label: str, fmt: str, nbytes: int, what: str) -> dict:
    a = ctx.args
    cmd = [sys.executable, HERE / "child_engine.py", engine, model, config, "--threads", a.threads, "--context",
           a.context, "--gen", a.gen, "--prefill", len(ctx.long), "--reps", a.reps, "--seed", a.seed]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=3600)
    if p.returncode:
        raise Unavailable(f"{engine} {label}: {child_failure(p)}")
    r = last_json(p)
    d, pf = r.pop("decode_s"), r.pop("prefill_s")
    return row({"ctranslate2": "CTranslate2", "openvino": "OpenVINO"}[engine], label, fmt, d, pf, nbytes, what, r)


def ensure_ctranslate2(ctx) -> Path:
    """The converter's path; ctranslate2 pip-installed into this venv when missing."""
    conv = Path(sys.executable).parent / "ct2-transformers-converter"
    if conv.is_file():
        return conv
    if ctx.args.no_install:
        raise Unavailable("ctranslate2 is not installed (and --no-install)")
    log("pip install ctranslate2")
    run_logged([sys.executable, "-m", "pip", "install", "ctranslate2"], ctx.cache / "logs" / "pip-ctranslate2.log",
               "pip install ctranslate2", timeout=1800)
    if not conv.is_file():
        raise Unavailable(f"pip installed ctranslate2 but {conv} is not there")
    return conv


def ctranslate2_rows(ctx) -> list:
    conv = ensure_ctranslate2(ctx)
    rows = []
    for q, fmt in CT2_TYPES.items():
        if fmt not in ctx.args.formats:
            continue
        out = ctx.ckpt.parent / f"ct2-{q}"
        try:
            if not (out / "model.bin").is_file():
                log(f"ct2-transformers-converter --quantization {q}")
                tmp = fresh(out)
                run_logged([conv, "--model", ctx.ckpt, "--output_dir", tmp, "--quantization", q],
                           ctx.cache / "logs" / f"ct2-{q}.log", f"ct2-transformers-converter --quantization {q}")
                tmp.rename(out)
            if ctx.args.prepare:
                continue
            rows.append(child_rows(ctx, "ctranslate2", out, q, q, fmt, (out / "model.bin").stat().st_size,
                                   "model.bin (file)"))
        except Unavailable as e:
            ctx.skip("CTranslate2", q, str(e))
    return rows


def ov_venv(ctx) -> Path:
    """optimum-cli in a venv of its own (optimum-intel pins transformers below the project's),
    made once: a venv without its marker file is an interrupted one, made again."""
    venv = ctx.cache / f"ov-venv-{OPTIMUM_INTEL}"
    cli, done = venv / "bin" / "optimum-cli", venv / "tblock-complete"
    if cli.is_file() and done.is_file():
        return cli
    if ctx.args.no_install:
        raise Unavailable(f"optimum-intel's venv {venv} is not there (and --no-install)")
    import openvino
    import torch
    ov_version = openvino.get_version().split("-")[0]
    log(f"making {venv} with optimum-intel {OPTIMUM_INTEL} (openvino {ov_version}, torch {torch.__version__})")
    if venv.exists():
        shutil.rmtree(venv)
    logs = ctx.cache / "logs"
    run_logged([sys.executable, "-m", "venv", venv], logs / "ov-venv.log", "python -m venv")
    pip = [venv / "bin" / "python", "-m", "pip"]
    # the torch release this venv has (pip prefers the local CPU build where one is offered),
    # and the openvino that runs the exported model here
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    run_logged([*pip, "install", f"optimum-intel[openvino]=={OPTIMUM_INTEL}", torch_pin, f"openvino=={ov_version}"],
               logs / "ov-venv-pip.log", "pip install optimum-intel into its venv", timeout=3600)
    # torchvision comes along, built for another torch than a CPU one: transformers then fails
    # to import (torchvision::nms missing); exporting a causal LM needs none of it
    run_logged([*pip, "uninstall", "-y", "torchvision"], logs / "ov-venv-pip-uninstall.log", "pip uninstall torchvision")
    done.write_text(f"optimum-intel {OPTIMUM_INTEL}, openvino {ov_version}, {torch_pin}\n")
    return cli


def openvino_rows(ctx) -> list:
    try:
        import openvino  # noqa: F401  the runtime that runs the model: the project's peers extra
    except ImportError as e:
        raise Unavailable(f"openvino is not importable ({e}): make bench-engines installs the peers extra") from None
    cli = ov_venv(ctx)
    rows = []
    for label, fmt, export, hint in OV_CONFIGS:
        if fmt not in ctx.args.formats:
            continue
        out = ctx.ckpt.parent / f"ov-{export[0]}"
        try:
            if not (out / "openvino_model.xml").is_file():
                log(f"optimum-cli export openvino --weight-format {' '.join(export)}")
                tmp = fresh(out)
                run_logged([cli, "export", "openvino", "--model", ctx.ckpt, "--task", "text-generation-with-past",
                            "--disable-convert-tokenizer", "--weight-format", *export, tmp],
                           ctx.cache / "logs" / f"ov-{export[0]}.log", f"optimum-cli export --weight-format {export[0]}")
                tmp.rename(out)
            if ctx.args.prepare:
                continue
            what = "openvino_model.bin (file)" + ("; the bf16 hint makes bf16 copies of its fp32 weights when compiling"
                                                  if hint == "bf16" else "")
            rows.append(child_rows(ctx, "openvino", out, hint, label, fmt,
                                   (out / "openvino_model.bin").stat().st_size, what))
        except Unavailable as e:
            ctx.skip("OpenVINO", label, str(e))
    return rows
