# opsbot on CPU: the llama.cpp engine and the default model (SmolLM2-135M-Instruct, Q8_0 GGUF) in
# the image, so a pod starts without reaching a model hub or a package index. No GPU, no driver.
#
#   docker build -t opsbot:cpu .                      (podman / buildah take the same file)
#   docker run -p 8080:8080 -e OPSBOT_SLACK__ENABLED=true -e OPSBOT_SLACK__BOT_TOKEN=xoxb-... \
#     -e OPSBOT_SLACK__APP_TOKEN=xapp-... opsbot:cpu
#
# A real model: mount a GGUF file and point OPSBOT_ENGINE__MODEL at it (docs/deploy.md). The
# database defaults to SQLite in /data (an evaluation database: one replica, lost with the
# container unless /data is a volume); set OPSBOT_STORE__URL to PostgreSQL for anything shared.
# The GPU (vLLM) image is Dockerfile.gpu.
ARG BASE_IMAGE=debian:bookworm-slim

# -- build: compile llama.cpp, install opsbot into a venv, fetch the default model ---------------
FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential cmake ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/opsbot \
    PATH=/opt/opsbot/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# llama.cpp would otherwise tune itself to the build machine's CPU (GGML_NATIVE) and crash with
# SIGILL on an older node; x86-64-v3 (AVX2 + FMA + F16C, every x86 server since 2013) keeps the
# fast kernels and runs everywhere a cluster schedules it.
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
RUN python3 -m venv "$VIRTUAL_ENV" && pip install --upgrade pip
WORKDIR /src
# Dependencies first, so a code change does not recompile llama.cpp.
COPY pyproject.toml README.md ./
COPY bot/__init__.py bot/__init__.py
RUN pip install '.[llamacpp]' && pip uninstall -y opsbot
COPY bot ./bot
COPY inference ./inference
COPY migrations ./migrations
# The model is fetched and converted to Q8_0 here; the build fails if the conversion did not happen
# (OPSBOT_ENGINE__MODEL below names the Q8_0 file).
RUN pip install --no-deps . \
 && python -c "from pathlib import Path; from bot.default_model import GGUF_NAME, ensure_default_gguf; \
path = ensure_default_gguf(Path('/opt/opsbot-data')); print(path); assert path.name == GGUF_NAME, path"

# -- runtime: the venv, the model, no compiler ----------------------------------------------------
FROM ${BASE_IMAGE}
# libgomp1: llama.cpp's OpenMP threads; python3: the interpreter the venv was made with.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/opsbot /opt/opsbot
COPY --from=build /opt/opsbot-data/models /opt/models
# Unprivileged user; /data holds the SQLite file when no PostgreSQL URL is given.
RUN useradd --create-home --uid 10001 opsbot && mkdir -p /data && chown opsbot /data
USER 10001
ENV PATH=/opt/opsbot/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    OPSBOT_ENGINE__BACKEND=llamacpp \
    OPSBOT_ENGINE__MODEL=/opt/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q8_0.gguf \
    OPSBOT_STORE__URL=sqlite+aiosqlite:////data/opsbot.db \
    OPSBOT_DATA_DIR=/data \
    OPSBOT_HTTP__HOST=0.0.0.0 \
    OPSBOT_HTTP__PORT=8080
EXPOSE 8080
# /healthz answers once the HTTP server is up; loading the 93 MB model takes seconds on CPU.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status != 200)"
ENTRYPOINT ["opsbot"]
CMD ["run"]
