/* The daemon's effective configuration: artfs's own mount options, the
 * config file, and their rendering as `key = value` lines. */
#ifndef ARTFS_CONFIG_H
#define ARTFS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define CONFIG_DEFAULT_STORE "/dev/shm/artfs"
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
	uint64_t ttl;         /* ttl=        seconds idle before collection, 0 never */
	char *allow_quant;    /* allow_quant= extra quantization methods for zero-copy */
	char *config_file;    /* config=     the file read at mount */
	uid_t uid;            /* uid=        owner shown for every entry */
	gid_t gid;            /* gid= */
	mode_t umask;         /* umask=      applied to directory and file modes */
	char *mountpoint;     /* informational, for .artfs/config */
	struct config_weights *weights;
	unsigned nweights;
	unsigned set;         /* CONFIG_SET_* bits of keys given on the command line */
};

/* Defaults: store /dev/shm/artfs, capacity 8G, max_object 64M, ttl 3600,
 * uid/gid of the calling process, umask 022. */
void config_init(struct artfs_config *c);
void config_free(struct artfs_config *c);

/* "8G", "64M", "4096", "1.5G" (binary units K M G T, optional trailing B
 * or iB). Returns 0 or -EINVAL. */
int config_parse_size(const char *text, uint64_t *out);

/* Sets one key. from_file: values already given on the command line win.
 * Returns 0, or -EINVAL with a message in err. Unknown keys: -ENOENT. */
int config_set(struct artfs_config *c, const char *key, const char *value, bool from_file,
	       char *err, size_t errlen);

/* Reads `key = value` lines (# comments, blank lines). Returns 0 or a
 * negative errno with a message naming the file and line in err. */
int config_load_file(struct artfs_config *c, const char *path, char *err, size_t errlen);

/* The effective configuration as `key = value` lines; malloc'd. */
char *config_render(const struct artfs_config *c);

#endif
