# The fuzz targets (tests/fuzz), built with clang and libFuzzer under
# AddressSanitizer and UBSan. GNU make; run by `make fuzz` through build.sh:
#     make -f tests/fuzz/fuzz.mk SRCDIR=<source dir> BUILDDIR=<build dir>
# The core's sources (src/*/*.c but the programs, libartfs and the log) are
# compiled once with coverage instrumentation into an archive; each target
# links what it uses from it.

SRCDIR ?= .
BUILDDIR ?= .
CLANG ?= clang
AR ?= ar
PKG_CONFIG ?= pkg-config

OUT = $(BUILDDIR)/tests/fuzz
OBJ = $(OUT)/obj
FUZZ = $(SRCDIR)/tests/fuzz

TARGETS = envelope npy safetensors checkpoint materialize control config attach namespace put \
	tree_names \
	cluster

SAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined
DEPS_CFLAGS := $(shell $(PKG_CONFIG) --cflags libcrypto jansson hiredis)
DEPS_LIBS := $(shell $(PKG_CONFIG) --libs libcrypto jansson) -lpthread
CPPFLAGS_FUZZ = -D_GNU_SOURCE -I$(OBJ)/shim -I$(SRCDIR)/include -I$(SRCDIR)/src -I$(SRCDIR) \
	-I$(BUILDDIR) -I$(FUZZ) $(DEPS_CFLAGS)
CFLAGS_FUZZ = -std=gnu11 -g -O1 -fno-omit-frame-pointer $(SAN) -fsanitize=fuzzer-no-link \
	-Wall -Wextra -Wshadow -Wno-unused-parameter -MMD -MP

# remote.c, slots.c and pipeline.c are the cluster client's I/O; its replies
# are read by cluster_reply.c and redis.c (parsed by hiredis), which the
# cluster target links.
SKIP = cmd/% lib/log.c remote/remote.c remote/slots.c remote/pipeline.c
HIREDIS_LIBS := $(shell $(PKG_CONFIG) --libs hiredis)
CORE = $(filter-out $(SKIP),$(patsubst $(SRCDIR)/src/%,%,$(wildcard $(SRCDIR)/src/*/*.c)))
CORE_OBJ = $(CORE:%.c=$(OBJ)/core/%.o) $(OBJ)/gpu_none.o $(OBJ)/fuzz_util.o $(OBJ)/log_quiet.o

all: $(TARGETS:%=$(OUT)/%)

# The build's autoconf.h without CUDA or hiredis: the fuzz build has the
# stub GPU backend (weights_load answers ENODEV) and no cluster client.
$(OBJ)/shim/autoconf.h: $(BUILDDIR)/autoconf.h
	@mkdir -p $(@D)
	printf '#include "%s"\n#undef HAVE_CUDA\n#undef HAVE_NCCL\n#undef HAVE_HIREDIS\n' "$(abspath $<)" > $@

$(OBJ)/core/%.o: $(SRCDIR)/src/%.c $(OBJ)/shim/autoconf.h
	@mkdir -p $(@D)
	$(CLANG) $(CPPFLAGS_FUZZ) $(CFLAGS_FUZZ) -c -o $@ $<

$(OBJ)/gpu_none.o: $(SRCDIR)/gpu/none.c $(OBJ)/shim/autoconf.h
	@mkdir -p $(@D)
	$(CLANG) $(CPPFLAGS_FUZZ) $(CFLAGS_FUZZ) -c -o $@ $<

$(OBJ)/%.o: $(FUZZ)/%.c $(OBJ)/shim/autoconf.h
	@mkdir -p $(@D)
	$(CLANG) $(CPPFLAGS_FUZZ) $(CFLAGS_FUZZ) -c -o $@ $<

$(OBJ)/libcore.a: $(CORE_OBJ)
	rm -f $@
	$(AR) rcs $@ $^

$(TARGETS:%=$(OUT)/%): $(OUT)/%: $(OBJ)/fuzz_%.o $(OBJ)/libcore.a
	$(CLANG) $(SAN) -fsanitize=fuzzer -o $@ $^ $(DEPS_LIBS) $(if $(filter cluster,$*),$(HIREDIS_LIBS))

clean:
	rm -rf $(OBJ) $(TARGETS:%=$(OUT)/%)

.PHONY: all clean
.SECONDARY:
.DELETE_ON_ERROR:

-include $(wildcard $(OBJ)/core/*/*.d $(OBJ)/*.d)
