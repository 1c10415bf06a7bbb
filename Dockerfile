# opsbot with the in-process vLLM engine on an NVIDIA GPU.
# Build:  docker build -t opsbot .
# Run:    docker run --gpus all -p 8080:8080 -e OPSBOT_ENGINE__MODEL=/models/my-model \
#           -e OPSBOT_STORE__URL=postgresql+asyncpg://opsbot@db/opsbot -v /srv/models:/models:ro opsbot
# vLLM 0.26.0 is built against torch 2.11 with CUDA 13; the runtime image only needs the driver.
FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/opsbot \
    PATH=/opt/opsbot/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first, so a code change does not re-download vLLM.
COPY pyproject.toml README.md ./
COPY bot/__init__.py bot/__init__.py
RUN python3 -m venv "$VIRTUAL_ENV" \
 && pip install --upgrade pip \
 && pip install '.[vllm]' \
 && pip uninstall -y opsbot
COPY bot ./bot
COPY inference ./inference
COPY migrations ./migrations
RUN pip install --no-deps '.[vllm]'

# Unprivileged user; its home holds the default SQLite file and the compile caches.
RUN useradd --create-home --uid 10001 opsbot && mkdir -p /data && chown opsbot /data
USER opsbot

# Model and database come from the environment (see README "Configuration").
ENV OPSBOT_ENGINE__BACKEND=vllm \
    OPSBOT_ENGINE__MODEL=/models/model \
    OPSBOT_STORE__URL=sqlite+aiosqlite:////data/opsbot.db \
    OPSBOT_DATA_DIR=/data \
    OPSBOT_HTTP__HOST=0.0.0.0 \
    OPSBOT_HTTP__PORT=8080

EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
  CMD python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status != 200)"

ENTRYPOINT ["opsbot"]
CMD ["run"]
