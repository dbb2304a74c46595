# The book's two commands (see README): `make book` and `make test`. Both set up .venv on their own.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.requirements-installed
BIN := $(CURDIR)/$(VENV)/bin
# Notebook kernels resolve "python" through PATH: put the venv first so they run in it.
export PATH := $(BIN):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: book test unit notebooks clean venv site-test pdf chromium poppler

# The venv is (re)built when it is missing or older than the files that define it.
$(STAMP): requirements.txt requirements-nodeps.txt code/pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

venv: $(STAMP)

## make book: build the website into _build/html, executing every notebook (two at a time, into an emptied cache
## that the build reads: tools/execute_book.py); any warning fails the build.
book: $(STAMP)
	rm -rf _build/html _build/.doctrees
	$(BIN)/python tools/execute_book.py
	$(BIN)/jupyter-book build . -W -n --keep-going

## make test: unit tests, then nbval over every chapter.
test: $(STAMP)
	$(BIN)/python -m pytest

unit: $(STAMP)
	$(BIN)/python -m pytest tests

notebooks: $(STAMP)
	$(BIN)/python -m pytest chapters

## make site-test: after `make book`, open every page in headless Chromium (JS errors, alt text, Colab links,
## math, offline), check internal links, and run one chapter the way a Colab reader would.
site-test: $(STAMP) chromium
	$(BIN)/python -m pytest tests_site -p no:nbval -o addopts="" -ra

## make pdf: after `make book`, the whole book as one PDF (_build/pdf/attnbook.pdf), printed by headless Chromium
## from the single-page edition (which reuses the executed notebooks of `make book`), then checked
## (tools/check_pdf.py: page count, every title, no raw markup, every figure).
pdf: $(STAMP) chromium poppler
	rm -rf _build/singlehtml _build/pdf
	$(BIN)/jupyter-book build . --builder singlehtml -W -n --keep-going
	$(BIN)/python tools/print_pdf.py _build/singlehtml _build/pdf/attnbook.pdf
	$(BIN)/python tools/check_pdf.py _build/pdf/attnbook.pdf _build/singlehtml

# Debian's chromium (Playwright's own browser download is not possible offline); installs it if missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

clean:
	rm -rf _build .pytest_cache .hypothesis

# Debian's poppler-utils (pdftotext, pdfinfo, pdfimages, pdftoppm): the PDF's contents page and its checks.
poppler:
	@command -v pdftotext >/dev/null 2>&1 || { \
	  echo "installing Debian's poppler-utils"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq poppler-utils >/dev/null; }
