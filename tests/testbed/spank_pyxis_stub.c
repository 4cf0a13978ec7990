/*
 * Test double for the pyxis SPANK plugin (slurmjob-operator integration tests).
 *
 * It only registers pyxis' srun options so that srun accepts them, and in the
 * remote context (slurmstepd, once per step and node) appends one JSON line
 * describing what it received to <record dir>/pyxis.jsonl.  It never runs a
 * container and never fails a step.
 *
 * Record dir: the job's SLURMJOB_TESTBED_RECORD_DIR, else the plugstack.conf
 * argument record_dir=DIR, else /srv/slurmjob-testbed/records.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_stub, 1);

#define REC_DEFAULT "/srv/slurmjob-testbed/records"

static int opt_noop(int val, const char *optarg, int remote)
{
	(void)val;
	(void)optarg;
	(void)remote;
	return 0;
}

struct spank_option spank_options[] = {
	{ "container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
	  "[pyxis test double] image to run the step in", 1, 0, opt_noop },
	{ "container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
	  "[pyxis test double] bind mounts", 1, 1, opt_noop },
	{ "container-workdir", "PATH",
	  "[pyxis test double] working directory inside the container", 1, 2,
	  opt_noop },
	{ "container-env", "NAME[,NAME...]",
	  "[pyxis test double] variables to take from the host", 1, 3,
	  opt_noop },
	{ "container-writable", NULL,
	  "[pyxis test double] make the container filesystem writable", 0, 4,
	  opt_noop },
	{ "no-container-mount-home", NULL,
	  "[pyxis test double] do not bind-mount the home directory", 0, 5,
	  opt_noop },
	SPANK_OPTIONS_TABLE_END
};

#define N_OPTS 6

static char record_dir[1024] = REC_DEFAULT;

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;

	(void)sp;
	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "record_dir=", 11) == 0)
			snprintf(record_dir, sizeof(record_dir), "%s", av[i] + 11);
	}
	return ESPANK_SUCCESS;
}

/* Append s to buf as a JSON string literal (with quotes). */
static void json_str(FILE *f, const char *s)
{
	const unsigned char *p;

	if (!s) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	for (p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"':
			fputs("\\\"", f);
			break;
		case '\\':
			fputs("\\\\", f);
			break;
		case '\n':
			fputs("\\n", f);
			break;
		case '\t':
			fputs("\\t", f);
			break;
		default:
			if (*p < 0x20)
				fprintf(f, "\\u%04x", *p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char *vals[N_OPTS] = { 0 };
	int given[N_OPTS] = { 0 };
	int any = 0, i, fd;
	uint32_t job_id = 0, step_id = 0;
	char host[256] = "", node[256] = "", cluster[256] = "", dir[1024],
	     path[1200], submit_dir[1024] = "", pwd[1024] = "", sluid[64] = "";
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	(void)ac;
	(void)av;
	if (spank_remote(sp) != 1)
		return ESPANK_SUCCESS;

	for (i = 0; i < N_OPTS; i++) {
		char *optarg = NULL;
		if (spank_option_getopt(sp, &spank_options[i], &optarg) ==
		    ESPANK_SUCCESS) {
			given[i] = 1;
			vals[i] = optarg;
			any = 1;
		}
	}
	if (!any)
		return ESPANK_SUCCESS;

	spank_get_item(sp, S_JOB_ID, &job_id);
	spank_get_item(sp, S_JOB_STEPID, &step_id);
	gethostname(host, sizeof(host) - 1);
	if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof(node)) !=
	    ESPANK_SUCCESS)
		node[0] = '\0';
	if (spank_getenv(sp, "SLURM_CLUSTER_NAME", cluster, sizeof(cluster)) !=
	    ESPANK_SUCCESS)
		cluster[0] = '\0';
	if (spank_getenv(sp, "SLURM_SUBMIT_DIR", submit_dir,
			 sizeof(submit_dir)) != ESPANK_SUCCESS)
		submit_dir[0] = '\0';
	if (spank_getenv(sp, "PWD", pwd, sizeof(pwd)) != ESPANK_SUCCESS)
		pwd[0] = '\0';
	if (spank_getenv(sp, "SLURM_JOB_SLUID", sluid, sizeof(sluid)) !=
	    ESPANK_SUCCESS)
		sluid[0] = '\0';
	if (spank_getenv(sp, "SLURMJOB_TESTBED_RECORD_DIR", dir, sizeof(dir)) !=
		    ESPANK_SUCCESS ||
	    !dir[0])
		snprintf(dir, sizeof(dir), "%s", record_dir);
	snprintf(path, sizeof(path), "%s/pyxis.jsonl", dir);

	f = open_memstream(&buf, &len);
	if (!f)
		return ESPANK_SUCCESS;
	fputs("{\"plugin\":\"pyxis_stub\",\"job_id\":", f);
	fprintf(f, "%u,\"step_id\":%u,\"hostname\":", job_id, step_id);
	json_str(f, host);
	fputs(",\"nodename\":", f);
	json_str(f, node);
	fputs(",\"cluster\":", f);
	json_str(f, cluster);
	fputs(",\"submit_dir\":", f);
	json_str(f, submit_dir);
	fputs(",\"cwd\":", f);
	json_str(f, pwd);
	fputs(",\"sluid\":", f);
	json_str(f, sluid);
	fprintf(f, ",\"time\":%ld", (long)time(NULL));
	fputs(",\"container_image\":", f);
	json_str(f, given[0] ? vals[0] : NULL);
	fputs(",\"container_mounts\":", f);
	json_str(f, given[1] ? vals[1] : NULL);
	fputs(",\"container_workdir\":", f);
	json_str(f, given[2] ? vals[2] : NULL);
	fputs(",\"container_env\":", f);
	json_str(f, given[3] ? vals[3] : NULL);
	fprintf(f, ",\"container_writable\":%s", given[4] ? "true" : "false");
	fprintf(f, ",\"no_container_mount_home\":%s", given[5] ? "true" : "false");
	fprintf(f, ",\"euid\":%u}\n", (unsigned)geteuid());
	fclose(f);

	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		slurm_error("pyxis_stub: cannot open %s: %s", path,
			    strerror(errno));
	} else {
		flock(fd, LOCK_EX);
		if (write(fd, buf, len) != (ssize_t)len)
			slurm_error("pyxis_stub: short write to %s", path);
		close(fd);
	}
	free(buf);
	return ESPANK_SUCCESS;
}
