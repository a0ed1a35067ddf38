/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's effective configuration: artfs's own mount options, the
 * config file, and their rendering as `key = value` lines. */
#ifndef ARTFS_CONFIG_H
#define ARTFS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CONFIG_DEFAULT_STORE "/dev/shm/artfs"
/* The least materialize_max= that capacity= gives by default. */
#define MATERIALIZE_MAX_FLOOR (64ULL << 20)
#define CONFIG_DEFAULT_MOUNTPOINT "/mnt/artifacts"

/* One checkpoint to preload at mount: `weights.<wv> = <dir>` in the file. */
struct config_weights {
	char *version;
	char *dir;
};

struct artfs_config {
	char *store;          /* store=      directory of committed objects */
	uint64_t capacity;    /* capacity=   bytes of committed objects */
	uint64_t max_object;  /* max_object= bytes of one object */
	uint64_t materialize_max; /* materialize_max= bytes open .materialize files may hold */
	uint64_t cache_capacity; /* cache_capacity= bytes of the .cache/ tree (DESIGN.md §9) */
	uint64_t cache_max_file; /* cache_max_file= bytes of one .cache/ file */
	uint64_t blocks_capacity; /* blocks_capacity= bytes of the .blocks/ tree (DESIGN.md §10) */
	uint64_t ttl;         /* ttl=        seconds idle before collection, 0 never */
	char *allow_quant;    /* allow_quant= extra quantization methods for zero-copy */
	char *config_file;    /* config=     the file read at mount */
	char *remote;         /* remote=     Redis Cluster seeds host:port[,host:port...], or NULL */
	char *remote_prefix;  /* remote_prefix= key namespace in the cluster */
	uint64_t remote_ttl;  /* remote_ttl= seconds a value lives in the cluster (default ttl=) */
	uint64_t remote_timeout; /* remote_timeout= seconds one cluster call may take */
	char *remote_auth;    /* remote_auth= file whose first line is the AUTH password */
	uid_t uid;            /* uid=        owner shown for every entry */
	gid_t gid;            /* gid= */
	mode_t umask;         /* umask=      applied to directory and file modes */
	uint64_t resend;      /* resend=     1: a new daemon has the kernel resend what a dead one read */
	char *mountpoint;     /* informational, for .artfs/config */
	struct config_weights *weights;
	unsigned nweights;
	unsigned set;         /* bits (1 << index in config_options) given on the command line */
	unsigned given;       /* bits given anywhere (command line or file) */
};

enum config_kind {
	CONFIG_PATH, CONFIG_TEXT, CONFIG_SIZE, CONFIG_SECONDS, CONFIG_ID, CONFIG_OCTAL, CONFIG_BOOL
};

enum config_flag {
	CONFIG_REQUIRED = 1 << 0,     /* never unset: an empty value is refused */
	CONFIG_COMMAND_LINE = 1 << 1, /* not in the config file */
};

/* One option: its name (the -o key, the config file key, the .artfs/config
 * key), how its value reads, where it lives, its default, and its usage
 * line. Everything that knows the options reads this table. */
struct config_option {
	const char *name;
	enum config_kind kind;
	size_t offset;        /* in struct artfs_config */
	const char *initial;  /* the default, as the option reads it; the usage
			       * line ends with it. NULL: none, or derived: */
	/* a default that follows other options or the daemon (help says so):
	 * set by config_init, and again by config_finish unless given */
	uint64_t (*derived)(const struct artfs_config *c);
	unsigned flags;       /* enum config_flag */
	const char *arg;      /* "SIZE", "DIR", ... */
	const char *help;
};

extern const struct config_option config_options[];
extern const size_t config_option_count;

/* The option of that name, and its bit in set/given; NULL if none. */
const struct config_option *config_option_find(const char *name, unsigned *bit);

/* Every option at its default (config_options[]: initial, derived). */
void config_init(struct artfs_config *c);
void config_free(struct artfs_config *c);

/* "8G", "64M", "4096", "1.5G" (binary units K M G T, optional trailing B
 * or iB). Returns 0 or -EINVAL. */
int config_parse_size(const char *text, uint64_t *out);

/* Sets one key. from_file: values already given on the command line win.
 * Returns 0, or -EINVAL with a message in err. Unknown keys: -ENOENT. */
int config_set(struct artfs_config *c, const char *key, const char *value, bool from_file,
	       char *err, size_t errlen);

/* s without leading and trailing white space (cut in place). */
char *config_trim(char *s);

/* Reads `key = value` lines (# comments, blank lines). Returns 0 or a
 * negative errno with a message naming the file and line in err. */
int config_load_file(struct artfs_config *c, const char *path, char *err, size_t errlen);

/* Derives the defaults that follow other options (materialize_max= from
 * capacity=, remote_ttl= from ttl=) where not given; call once every
 * source has been read. */
void config_finish(struct artfs_config *c);

/* One usage line per option. */
void config_usage(FILE *f);

/* The effective configuration as `key = value` lines; malloc'd. */
char *config_render(const struct artfs_config *c);

#endif
