/*
 * Recording SPANK plugin of the test bed (slurmjob-operator integration tests): an oracle of
 * what reaches the host side of a step, loaded beside the real Pyxis. It is not a Pyxis
 * double: it registers no option and changes nothing.
 *
 * In each task of a step (slurm_spank_task_init_privileged: as root, before the task drops
 * its privileges and before any container is entered), it appends one JSON line to
 * <record dir>/steps.jsonl, a root-owned file no job can write: the job and step ids, the
 * task's global rank, the node, the cluster, the SLUID, the working directory, the task's argv (for apptainer, `apptainer exec ... IMAGE CMD...`; for Pyxis, the command
 * itself) and the NAMES of the step's environment variables (never their values: a secret
 * travels there).
 *
 * Record dir: the plugstack.conf argument record_dir=DIR, else /srv/slurmjob-testbed/records.
 * A job cannot redirect the records (no variable of the job's is read for that).
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

SPANK_PLUGIN(slurmjob_record, 1);

#define REC_DEFAULT "/srv/slurmjob-testbed/records"

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

static void getenv_or_empty(spank_t sp, const char *name, char *buf, int len)
{
	if (spank_getenv(sp, name, buf, len) != ESPANK_SUCCESS)
		buf[0] = '\0';
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0, step_id = 0, uid = 0, task = 0;
	int argc = 0, i, fd;
	char **argv = NULL, **env = NULL;
	char node[256], cluster[256], pwd[1024], sluid[64], path[1200];
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	(void)ac;
	(void)av;
	if (spank_remote(sp) != 1)
		return ESPANK_SUCCESS;
	spank_get_item(sp, S_JOB_ID, &job_id);
	spank_get_item(sp, S_JOB_STEPID, &step_id);
	spank_get_item(sp, S_JOB_UID, &uid);
	spank_get_item(sp, S_TASK_GLOBAL_ID, &task);
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS)
		argc = 0;
	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS)
		env = NULL;
	/* The node slurmstepd serves: its own environment's (slurmd's), not the job's, where
	 * srun passes on the batch step's node name to steps on other nodes. */
	if (getenv("SLURMD_NODENAME"))
		snprintf(node, sizeof(node), "%s", getenv("SLURMD_NODENAME"));
	else
		getenv_or_empty(sp, "SLURMD_NODENAME", node, sizeof(node));
	getenv_or_empty(sp, "SLURM_CLUSTER_NAME", cluster, sizeof(cluster));
	/* The task's working directory: its PWD when srun passed one, else where slurmstepd
	 * put the task (srun --export=NAMES passes no PWD). */
	getenv_or_empty(sp, "PWD", pwd, sizeof(pwd));
	if (!pwd[0] && !getcwd(pwd, sizeof(pwd)))
		pwd[0] = '\0';
	getenv_or_empty(sp, "SLURM_JOB_SLUID", sluid, sizeof(sluid));
	snprintf(path, sizeof(path), "%s/steps.jsonl", record_dir);

	f = open_memstream(&buf, &len);
	if (!f)
		return ESPANK_SUCCESS;
	fprintf(f, "{\"plugin\":\"slurmjob_record\",\"job_id\":%u,\"step_id\":%u,\"uid\":%u,\"task\":%u",
		job_id, step_id, uid, task);
	fputs(",\"nodename\":", f);
	json_str(f, node);
	fputs(",\"cluster\":", f);
	json_str(f, cluster);
	fputs(",\"cwd\":", f);
	json_str(f, pwd);
	fputs(",\"sluid\":", f);
	json_str(f, sluid);
	fprintf(f, ",\"time\":%ld,\"argv\":[", (long)time(NULL));
	for (i = 0; i < argc; i++) {
		if (i)
			fputc(',', f);
		json_str(f, argv[i]);
	}
	fputs("],\"env_names\":[", f);
	for (i = 0; env && env[i]; i++) {
		const char *eq = strchr(env[i], '=');
		char name[256];
		size_t n = eq ? (size_t)(eq - env[i]) : strlen(env[i]);

		if (n >= sizeof(name))
			n = sizeof(name) - 1;
		memcpy(name, env[i], n);
		name[n] = '\0';
		if (i)
			fputc(',', f);
		json_str(f, name);
	}
	fputs("]}\n", f);
	fclose(f);

	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		slurm_error("slurmjob_record: cannot open %s: %s", path, strerror(errno));
	} else {
		flock(fd, LOCK_EX);
		if (write(fd, buf, len) != (ssize_t)len)
			slurm_error("slurmjob_record: short write to %s", path);
		close(fd);
	}
	free(buf);
	return ESPANK_SUCCESS;
}
