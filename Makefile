# Flare / Selene build.  GNU Make; everything lands under $(BUILD).
#
#   make                 libselene (static + shared), flare, tests, benches
#   make check           build and run every test (tests/run-tests)
#   make check-asan      the same under AddressSanitizer + UBSan (build/asan)
#   make check-tsan      the same under ThreadSanitizer (build/tsan)
#   make bench           build and run the benchmarks (RESULT lines)
#   make fuzz            build libFuzzer targets with clang and run each briefly
#   make install         PREFIX=/usr/local DESTDIR=
#
# Every target first runs scripts/install-deps, so a fresh Debian 12 machine
# needs nothing but make.

BUILD    ?= build
SANITIZE ?=
PREFIX   ?= /usr/local
DESTDIR  ?=
CC       ?= cc
OPT      ?= -O2
TEST_TIMEOUT ?= 300

VERSION := 0.1.0

DEPS_CFLAGS := $(shell pkg-config --cflags libmicrohttpd jansson hiredis 2>/dev/null)
DEPS_LIBS   := $(shell pkg-config --libs libmicrohttpd jansson hiredis 2>/dev/null)

CFLAGS_BASE := -std=gnu11 -Wall -Wextra -Werror -g $(OPT) -fPIC -MMD -MP \
	-D_GNU_SOURCE -Iinclude -Isrc -Isrc/eos -Isrc/selene -Itests
ifneq ($(SANITIZE),)
CFLAGS_BASE += -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS_SAN := -fsanitize=$(SANITIZE)
# The sanitizer builds run the same test programs; say which build in logs.
CFLAGS_BASE += -DSEL_SANITIZED=1
endif
override CFLAGS := $(CFLAGS_BASE) $(DEPS_CFLAGS) $(CFLAGS)
LIBS := -luring -lxxhash -lsodium -lhiredis -lpthread -ldl -lm

# ---- sources ---------------------------------------------------------------
EOS_SRCS    := $(sort $(wildcard src/eos/*.c))
SELENE_SRCS := $(sort $(wildcard src/selene/*.c))
HELIOS_SRCS := $(sort $(wildcard src/helios/*.c))
FLARE_SRCS  := $(sort $(wildcard src/flare/*.c))
TEST_SRCS   := $(sort $(wildcard tests/test_*.c))
TESTLIB_SRCS:= $(sort $(filter-out $(TEST_SRCS),$(wildcard tests/*.c)))
BENCH_SRCS  := $(sort $(filter-out bench/benchlib.c,$(wildcard bench/*.c)))
BENCHLIB_SRCS := bench/benchlib.c
FUZZ_SRCS   := $(sort $(wildcard fuzz/fuzz_*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_OBJS    := $(call obj,$(EOS_SRCS) $(SELENE_SRCS))
HELIOS_OBJS := $(call obj,$(HELIOS_SRCS))
# The flare command is main.c plus libflare.a (everything else in src/flare/),
# so tests and fuzz replays can link the front end without main().  The real
# engine backend (src/flare/backend_engine.c, which calls hel_engine_*) sits in
# the archive too and is linked only when something references
# flare_engine_backend: main.c does not until src/helios/engine.c exists.
FLARE_MAIN_OBJ := $(call obj,src/flare/main.c)
FLARE_LIB_SRCS := $(filter-out src/flare/main.c,$(FLARE_SRCS))
FLARE_LIB_OBJS := $(call obj,$(FLARE_LIB_SRCS))
TESTLIB_OBJS:= $(call obj,$(TESTLIB_SRCS))
BENCHLIB_OBJS := $(call obj,$(BENCHLIB_SRCS))

STATIC_LIB  := $(BUILD)/libselene.a
SHARED_LIB  := $(BUILD)/libselene.so.$(VERSION)
SHARED_SONAME := libselene.so.0
HELIOS_LIB  := $(BUILD)/libhelios.a
FLARE_LIB   := $(BUILD)/libflare.a
FLARE       := $(BUILD)/flare
# flare links only once src/flare/ holds its main; until then the lower
# modules' tests still build and run.
FLARE_IF_ANY := $(if $(FLARE_SRCS),$(FLARE))
PCFILE      := $(BUILD)/selene.pc

TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
FUZZ_REPLAYS := $(patsubst fuzz/fuzz_%.c,$(BUILD)/fuzz/replay_%,$(FUZZ_SRCS))
FUZZERS := $(patsubst fuzz/fuzz_%.c,$(BUILD)/fuzz/fuzz_%,$(FUZZ_SRCS))
# Shell-script tests (qualification scenarios at small sizes) run as they are.
SCRIPT_TESTS := $(sort $(wildcard tests/test_*.sh tests/test_*.py))

DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all check check-asan check-tsan bench fuzz install uninstall clean deps soak qualify
.DEFAULT_GOAL := all
# Keep object files of tests, benches and fuzz replays (pattern-rule
# intermediates) so rebuilds stay incremental.
.SECONDARY:

all: $(STATIC_LIB) $(SHARED_LIB) $(PCFILE) $(FLARE_IF_ANY) $(TESTS) $(BENCHES) $(FUZZ_REPLAYS)

deps: $(DEPS_STAMP)
$(DEPS_STAMP): scripts/install-deps
	@scripts/install-deps --quiet
	@mkdir -p $(@D) && touch $@

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(STATIC_LIB): $(LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(SHARED_LIB): $(LIB_OBJS)
	$(CC) -shared -Wl,-soname,$(SHARED_SONAME) $(LDFLAGS_SAN) -o $@ $^ $(LIBS)
	ln -sf $(notdir $@) $(BUILD)/$(SHARED_SONAME)
	ln -sf $(notdir $@) $(BUILD)/libselene.so

$(HELIOS_LIB): $(HELIOS_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(FLARE_LIB): $(FLARE_LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(PCFILE): selene.pc.in Makefile
	@mkdir -p $(@D)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@

ALL_STATIC := $(HELIOS_LIB) $(STATIC_LIB)
# Tests and fuzz replays: the flare front end first (it uses Helios and Selene).
TEST_STATIC := $(if $(FLARE_LIB_SRCS),$(FLARE_LIB)) $(ALL_STATIC)

$(FLARE): $(FLARE_MAIN_OBJ) $(FLARE_LIB) $(ALL_STATIC)
	$(CC) $(LDFLAGS_SAN) -o $@ $(FLARE_MAIN_OBJ) $(FLARE_LIB) $(ALL_STATIC) $(DEPS_LIBS) $(LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TESTLIB_OBJS) $(TEST_STATIC)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_SAN) -o $@ $< $(TESTLIB_OBJS) $(TEST_STATIC) $(DEPS_LIBS) $(LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BENCHLIB_OBJS) $(TESTLIB_OBJS) $(ALL_STATIC)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_SAN) -o $@ $< $(BENCHLIB_OBJS) $(TESTLIB_OBJS) $(ALL_STATIC) $(DEPS_LIBS) $(LIBS)

# Replay drivers: each fuzz target linked with fuzz/replay.c runs its corpus
# (fuzz/corpus/<name>/) as an ordinary test inside make check.
$(BUILD)/fuzz/replay_%: $(BUILD)/obj/fuzz/fuzz_%.o $(BUILD)/obj/fuzz/replay.o $(TEST_STATIC)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_SAN) -o $@ $< $(BUILD)/obj/fuzz/replay.o $(TEST_STATIC) $(DEPS_LIBS) $(LIBS)

# ---- tests -----------------------------------------------------------------
RUN_TESTS = SELENE_SRCDIR=$(CURDIR) SELENE_BUILD=$(abspath $(BUILD)) \
	tests/run-tests -t $(TEST_TIMEOUT)

check: $(TESTS) $(FUZZ_REPLAYS) $(FLARE_IF_ANY)
	@$(RUN_TESTS) $(TESTS) $(FUZZ_REPLAYS) $(SCRIPT_TESTS)

check-asan:
	@$(MAKE) --no-print-directory BUILD=build/asan SANITIZE=address,undefined OPT=-O1 check

check-tsan:
	@$(MAKE) --no-print-directory BUILD=build/tsan SANITIZE=thread OPT=-O1 check

# Long soaks (crash cycles, shutdown cycles) are selected by SELENE_SOAK=1.
soak: $(TESTS) $(FLARE)
	@SELENE_SOAK=1 $(RUN_TESTS) $(TESTS) $(SCRIPT_TESTS)

# Scenario scripts: every qualify/*.py but the harness module flare.py.
QUALIFY_SCRIPTS := $(filter-out qualify/flare.py,$(sort $(wildcard qualify/*.py)))

qualify: $(FLARE)
	@if [ -n "$(QUALIFY_SCRIPTS)" ]; then \
		for q in $(QUALIFY_SCRIPTS); do echo "== $$q --full"; \
			python3 $$q --flare $(FLARE) --full || exit 1; done; \
	else echo "qualify: no scenarios yet"; fi

# bench/serve.py: the isolation measurements of design 4 against flare run
# (about eleven minutes on Qwen TP1; SERVE_ARGS=--quick for a smoke run).
SERVE_ARGS ?=
bench: $(BENCHES) $(FLARE_IF_ANY)
	@set -e; for b in $(BENCHES); do echo "== $$b"; $$b; done; \
	if [ -n "$(FLARE_IF_ANY)" ]; then echo "== bench/serve.py $(SERVE_ARGS)"; \
		python3 bench/serve.py --flare $(FLARE) $(SERVE_ARGS); fi

# ---- fuzzing (clang + libFuzzer) ------------------------------------------
FUZZ_SECONDS ?= 30
FUZZ_CFLAGS := -std=gnu11 -g -O1 -D_GNU_SOURCE -Iinclude -Isrc -Isrc/eos -Isrc/selene \
	-fsanitize=fuzzer,address,undefined $(DEPS_CFLAGS)
# libFuzzer links sources, not archives: leave out the real engine backend,
# which nothing in a fuzzer references (see FLARE_LIB_SRCS above).
FUZZ_LIB_SRCS := $(EOS_SRCS) $(SELENE_SRCS) $(HELIOS_SRCS) \
	$(filter-out src/flare/backend_engine.c,$(FLARE_LIB_SRCS))

$(BUILD)/fuzz/fuzz_%: fuzz/fuzz_%.c $(FUZZ_LIB_SRCS) | $(DEPS_STAMP)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_LIB_SRCS) $(DEPS_LIBS) $(LIBS)

fuzz: $(FUZZERS)
	@set -e; for f in $(FUZZERS); do n=$${f##*/fuzz_}; mkdir -p $(BUILD)/fuzz/work_$$n; \
		echo "== fuzz $$n ($(FUZZ_SECONDS)s)"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/fuzz/work_$$n fuzz/corpus/$$n; done

# ---- install ---------------------------------------------------------------
install: $(STATIC_LIB) $(SHARED_LIB) $(PCFILE) $(FLARE)
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/selene.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(STATIC_LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED_LIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf $(notdir $(SHARED_LIB)) $(DESTDIR)$(PREFIX)/lib/$(SHARED_SONAME)
	ln -sf $(notdir $(SHARED_LIB)) $(DESTDIR)$(PREFIX)/lib/libselene.so
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' selene.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/selene.pc
	install -m 755 $(FLARE) $(DESTDIR)$(PREFIX)/bin/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/selene.h $(DESTDIR)$(PREFIX)/lib/libselene.* \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/selene.pc $(DESTDIR)$(PREFIX)/bin/flare

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
