"""The CEL of the chart's admission policies (`gen.admission`): the variables that find whose
namespace a request is in, and those that say the reconciler's refusals of a SlurmJob, one
list of messages per step of the reconciler, in its order (`refusal` is the first non-empty
one, as `<Reason>: <messages joined by '; '>`).

Every message is the reconciler's, word for word: tests/unit/test_admission.py compares each
with what the reconciler's own functions say of the same manifest. Names a user wrote
(account, partition, QOS) are shown as Python's `repr` shows them (`py_repr`); names the CRD's
patterns keep plain (clusters, mount sources, MPI plugins) are quoted as it would.
"""

from __future__ import annotations

#: Where the chart puts its own values into the generated template.
SITE = "@@SITE@@"
REFUSE = "@@REFUSE_UNCLAIMED@@"
OPERATOR = "@@OPERATOR@@"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: `spec.mounts` holds at most this many (the CRD's maxItems): their indices, for messages.
MAX_MOUNTS = 128
#: The spec fields the rules read: an update that changes none of them is not judged.
JUDGED_FIELDS = (
    "cluster",
    "account",
    "partition",
    "qos",
    "timeLimit",
    "walltime",
    "mounts",
    "framework",
    "launch",
)


def get(key: str) -> str:
    """The site map's value at `key` (a CEL string expression), '' where it has none."""
    return f"(({key}) in variables.site ? variables.site[{key}] : '')"


def split(value: str) -> str:
    """A joined list as a CEL list ('' is the empty list)."""
    return f"(({value}) == '' ? [] : ({value}).split(', '))"


def py_repr(value: str) -> str:
    """CEL for Python's `repr` of a string, as the reconciler's messages show a name (quotes,
    backslashes, tabs and line breaks escaped as Python does)."""
    escaped = (
        f"{value}.replace('\\\\', '\\\\\\\\').replace('\\n', '\\\\n')"
        ".replace('\\r', '\\\\r').replace('\\t', '\\\\t')"
    )
    return (
        f"({value}.contains(\"'\") && !{value}.contains('\"') ? '\"' + {escaped} + '\"' "
        f': "\'" + {escaped}.replace("\'", "\\\\\'") + "\'")'
    )


def minutes(value: str) -> str:
    """CEL for `parse_time_limit` of a field the CRD has admitted (minutes or 1d2h30m)."""
    text = f"string({value}).trim()"

    def part(unit: str, scale: int) -> str:
        found = f"string({value}).find('[0-9]+{unit}')"
        return f"({found} == '' ? 0 : int({found}.replace('{unit}', '')) * {scale})"

    return (
        f"(type({value}) == int ? {value} : {text}.matches('^[0-9]+$') ? int({text}) : "
        f"{part('d', 1440)} + {part('h', 60)} + {part('m', 1)})"
    )


def _var(name: str, expression: str) -> dict[str, str]:
    return {"name": name, "expression": expression}


def scope_variables() -> list[dict[str, str]]:
    """Whose namespace this is: the variables both policies start with."""
    return [
        _var("site", SITE),
        _var("refuseUnclaimed", REFUSE),
        _var("tenant", get("'namespace/' + request.namespace")),
        _var(
            "claimed",
            "variables.tenant != '' || "
            + get("'site/tenancy'")
            + " != 'true' || variables.refuseUnclaimed",
        ),
    ]


def _under(path: str, source: str) -> str:
    return f"({path} == {source} || {path}.startsWith({source} + '/'))"


def _mount_why() -> str:
    """Why the tenant may not mount `m` (a phrase after its source), '' when it may: the lexical
    rules of `site.mounts._problem` (the runtimes folder and symlinks are the reconciler's)."""
    s, first = "m.source", "m.source.split('/')[0]"
    t = "variables.tenant"
    mine = f"variables.own.exists(o, {_under(s, 'o')})"
    deeper = (
        f"variables.others.exists(o, {_under(s, 'o')} && "
        f"variables.own.all(x, !{_under(s, 'x')} || size(x) < size(o)))"
    )
    below_foreign = f"variables.others.exists(o, {_under('o', s)} && !(o in variables.own))"
    shared = (
        f"variables.others.exists(o, ({_under(s, 'o')} && "
        f"variables.own.all(x, !{_under(s, 'x')} || size(x) <= size(o))) || {_under('o', s)})"
    )
    return (
        f"(('namespace/' + {first}) in variables.site || {first} == request.namespace) ? "
        f"'is in the staging tree of namespace ' + {first} + ' (<storage root>/' + {first} + "
        "' holds the job files of its SlurmJobs)' : "
        f"!{mine} ? (size(variables.own) == 0 ? 'cannot be mounted: tenant ' + {t} + "
        f"' has no mountSources' : 'is not under tenant ' + {t} + \"'s mountSources (\" + "
        "variables.mountSources + ')') : "
        f'{deeper} || {below_foreign} ? "reaches into another tenant\'s mount source" : '
        f"!(has(m.readOnly) && m.readOnly) && {shared} ? "
        "'is shared with another tenant, so it is read-only: set readOnly: true' : ''"
    )


def _one_of(field: str, limit: str, words: str) -> str:
    spec = f"object.spec.{field}"
    return (
        f"(has({spec}) && !({spec} in {split(f'variables.{limit}')}) ? ['spec.{field}: ' + "
        f"{py_repr(spec)} + ' is not in tenant ' + variables.tenant + \"'s {words} (\" + "
        f"variables.{limit} + ')'] : [])"
    )


def _limits_stage() -> str:
    partition = "object.spec.partition"
    listed = (
        f"has({partition}) && {partition}.contains(',') ? ['spec.partition: ' + "
        f'{py_repr(partition)} + " is a list; a tenant\'s job names one partition (one of " '
        "+ variables.partitions + ')'] : "
    )
    time = (
        "(variables.maxTime != '' && has(object.spec.timeLimit) && variables.timeLimit > "
        "int(variables.maxTime) ? ['spec.timeLimit: ' + string(variables.timeLimit) + "
        "' minutes is longer than tenant ' + variables.tenant + \"'s maxTimeLimit of \" + "
        "variables.maxTime + ' minutes'] : [])"
    )
    qos = f"(variables.qos == '' ? [] : {_one_of('qos', 'qos', 'qos list')})"
    mpi = "object.spec.launch.mpi"
    allowed = get("'site/mpi'")
    mpi_check = (
        f"(has(object.spec.launch) && has({mpi}) && {mpi} != '' && !({mpi} in "
        f"{split(allowed)}) ? ['spec.launch.mpi: MPI plugin ' + \"'\" + {mpi} + \"'\" + "
        f"' is not one the site allows: ' + ({allowed} == '' ? 'none (SLURMJOB_MPI_PLUGINS)' "
        f": {allowed})] : [])"
    )
    tenant = (
        f"({listed}{_one_of('partition', 'partitions', 'partitions')}) + "
        f"{_one_of('account', 'accounts', 'accounts')} + {qos} + {time} + "
        "variables.mountMessages"
    )
    return f"(variables.tenant == '' ? [] : {tenant}) + {mpi_check}"


def _image_stage() -> str:
    field = "spec.framework.image"
    matched = (
        "variables.imageRegistries.split(', ').exists(e, e == variables.imageHost || "
        "variables.imageName == e || variables.imageName.startsWith(e + '/'))"
    )
    return (
        "variables.image == '' ? [] : "
        f"{get(repr('site/images'))} != 'true' ? ['{field}: this site does not enable images "
        "(SLURMJOB_IMAGES_ENABLED, chart value images.enabled): name a runtime of its registry "
        "with runtimeId'] : "
        f"variables.imageRegistries == '' ? ['{field}: ' + variables.imageWhere + "
        "' lists no registry'] : "
        f"!{matched} ? ['{field}: image ' + variables.image + ': registry ' + "
        "variables.imageHost + ' (with this path) is not among the registries listed for the "
        "tenant (' + variables.imageWhere + ')'] : []"
    )


def _own(key: str) -> str:
    """The tenant's own value at `key` (`tenant/<t>/<key>`)."""
    return get(f"'tenant/' + variables.tenant + '/{key}'")


def slurmjob_variables() -> list[dict[str, str]]:
    skey = "'tenant/' + variables.tenant + '@' + variables.placed + '/'"
    out = scope_variables()
    out += [
        _var("clusters", f"{get(repr('site/clusters'))}.split(', ')"),
        _var(
            "wanted",
            "has(object.spec.cluster) ? object.spec.cluster : variables.tenant == '' ? '' : "
            + _own("default"),
        ),
        _var(
            "placed",
            "variables.wanted != '' && variables.wanted in variables.clusters ? "
            "variables.wanted : variables.clusters[0]",
        ),
    ]
    for name, key in (
        ("accounts", "accounts"),
        ("partitions", "partitions"),
        ("qos", "qos"),
        ("mountSources", "mounts"),
        ("maxTime", "maxTime"),
        ("maxTotal", "maxTotal"),
    ):
        at = f"{skey} + '{key}'"
        found = f"({at}) in variables.site ? variables.site[{at}] : "
        out.append(_var(name, found + _own(key)))
    out += [
        _var("own", split("variables.mountSources")),
        _var("others", split(_own("others"))),
        _var("mounts", "has(object.spec.mounts) ? object.spec.mounts : []"),
        _var("mountWhy", f"variables.mounts.map(m, {_mount_why()})"),
        _var(
            "mountMessages",
            f"{list(range(MAX_MOUNTS))}.filter(i, i < size(variables.mounts) && "
            "variables.mountWhy[i] != '').map(i, 'spec.mounts[' + string(i) + '].source: ' + "
            '"\'" + variables.mounts[i].source + "\' " + variables.mountWhy[i])',
        ),
        _var(
            "timeLimit",
            f"has(object.spec.timeLimit) ? {minutes('object.spec.timeLimit')} : 0",
        ),
        _var(
            "totalTime",
            f"has(object.spec.walltime) ? {minutes('object.spec.walltime.totalTime')} : 0",
        ),
        _var(
            "segmentTime",
            "has(object.spec.walltime) && has(object.spec.walltime.segmentTime) ? "
            f"{minutes('object.spec.walltime.segmentTime')} : 0",
        ),
        _var(
            "image",
            "has(object.spec.framework) && has(object.spec.framework.image) ? "
            "object.spec.framework.image : ''",
        ),
        _var("imageHost", "variables.image.find('^[^/]+')"),
        _var("imageName", "variables.image.find('^[^/]+/[^:@]+')"),
        _var(
            "imageRegistries",
            f"variables.tenant != '' ? {_own('images')} : {get(repr('site/registries'))}",
        ),
        _var(
            "imageWhere",
            "variables.tenant != '' ? 'tenant ' + variables.tenant + \"'s imageRegistries\" : "
            "'SLURMJOB_IMAGE_REGISTRIES'",
        ),
        _var(
            "siteMaxTotal",
            f"{get(repr('site/maxTotal'))} == '' ? 0 : int({get(repr('site/maxTotal'))})",
        ),
        _var(
            "tenantTotal",
            "variables.maxTotal != '' && int(variables.maxTotal) < variables.siteMaxTotal",
        ),
        _var(
            "queueStage",
            f"variables.tenant != '' && {_own('queue')} == 'true' && "
            f"!(has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels && "
            f"object.metadata.labels['{QUEUE_LABEL}'] != '') ? ['metadata.labels: the tenant of "
            f"namespace ' + request.namespace + ' requires a Kueue LocalQueue (label "
            f"{QUEUE_LABEL}); nothing was submitted'] : []",
        ),
        _var(
            "unknownStage",
            f"variables.tenant == '' && {get(repr('site/tenancy'))} == 'true' ? "
            "['metadata.namespace: namespace ' + \"'\" + request.namespace + \"'\" + ' belongs "
            "to no tenant of this site' + \"'\" + 's tenants file, so its SlurmJobs are not "
            "submitted; ask the platform admin to add it to a tenant'] : []",
        ),
        _var(
            "clusterStage",
            f"variables.tenant != '' && {_own('clusters')} != '' && "
            f"!(variables.placed in {_own('clusters')}.split(', ')) ? "
            "['spec.cluster: tenant ' + variables.tenant + ' may use clusters ' + "
            f"{_own('clusters')} + '; not ' + variables.placed] : "
            "has(object.spec.cluster) && !(object.spec.cluster in variables.clusters) ? "
            "['spec.cluster: ' + \"'\" + object.spec.cluster + \"'\" + ' is not a cluster of "
            f"this operator (known: ' + {get(repr('site/clusters'))} + ')'] : []",
        ),
        _var("imageStage", _image_stage()),
        _var("limitStage", _limits_stage()),
        _var(
            "walltimeStage",
            "!has(object.spec.walltime) ? [] : "
            "variables.totalTime > (variables.tenantTotal ? int(variables.maxTotal) : "
            "variables.siteMaxTotal) ? ['spec.walltime.totalTime: ' + "
            "string(variables.totalTime) + ' minutes is longer than ' + (variables.tenantTotal "
            "? 'tenant ' + variables.tenant + \"'s maxTotalTime\" : \"the site's maximum "
            "(SLURMJOB_MAX_TOTAL_TIME)\") + ' of ' + string(variables.tenantTotal ? "
            "int(variables.maxTotal) : variables.siteMaxTotal) + ' minutes'] : "
            "has(object.spec.walltime.segmentTime) && variables.maxTime != '' && "
            "variables.segmentTime > int(variables.maxTime) ? ['spec.walltime.segmentTime: ' + "
            "string(variables.segmentTime) + ' minutes is longer than tenant ' + "
            "variables.tenant + \"'s maxTimeLimit of \" + variables.maxTime + ' minutes'] : []",
        ),
    ]
    stages = [
        ("queueStage", "InvalidSpec"),
        ("unknownStage", "TenantUnknown"),
        ("clusterStage", "InvalidSpec"),
        ("imageStage", "InvalidSpec"),
        ("limitStage", "InvalidSpec"),
        ("walltimeStage", "InvalidSpec"),
    ]
    refusal = "!variables.claimed ? '' : "
    for stage, reason in stages:
        refusal += f"size(variables.{stage}) > 0 ? '{reason}: ' + variables.{stage}.join('; ') : "
    out.append(_var("refusal", refusal + "''"))
    return out
