#!/bin/sh
# The image's build steps, run by the Dockerfile and, without Docker, by
# tests/test_production_install.py on the same build context: install the project (not
# editable) with its dependencies, then collect the static files into the image, where
# whitenoise serves them from their manifest (DEBUG off needs it; no container writes it later).
set -eu
python -m pip install .
# collectstatic reads settings, never the database or Redis: placeholders that nothing uses
DEBUG=false SECRET_KEY=collectstatic-at-build-time-not-a-runtime-key \
  DATABASE_URL=postgres://build@127.0.0.1:9/build REDIS_URL=redis://127.0.0.1:9/0 \
  python manage.py collectstatic --noinput -v 0
