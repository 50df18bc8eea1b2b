// Regenerate lane_vectors.json by executing the reference TypeScript module under Node.
//
// The reference is read at run time from ../shared/seed/absurd-shared.ts (beside the repository);
// nothing of it is kept here. Its imports point at modules we do not have: they are replaced by
// the small stubs below, written from DESIGN.md ("Lane rules").
//
// Usage (esbuild is resolved from the current directory, so install it outside the repository):
//   mkdir -p /tmp/vectors && cd /tmp/vectors && npm install esbuild@0.24
//   node /path/to/repo/tests/unit/data/gen_lane_vectors.mjs [path/to/absurd-shared.ts]
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const seedPath = path.resolve(
  process.argv[2] ?? path.join(here, '../../../../shared/seed/absurd-shared.ts'),
);
const outPath = path.join(here, 'lane_vectors.json');
const esbuild = createRequire(path.join(process.cwd(), 'resolve-from-here.js'))('esbuild');

const QUEUE_SUFFIX_ENV = 'DEEPLINE_ABSURD_QUEUE_SUFFIX';
const SCHEMA_ENV = 'DEEPLINE_RUNTIME_SCHEDULER_SCHEMA';
const DEPLOY_ENV = 'DEEPLINE_RUNTIME_DEPLOY_VERSION';
const FIXED_NOW_MS = 1_750_000_000_000;

// ---------------------------------------------------------------------------------------------
// Stubs for the reference's imports (behaviour as DESIGN.md describes it; JS string semantics).
// ---------------------------------------------------------------------------------------------
const STUBS = {
  './absurd-queue-suffix': `
    import { createHash } from 'node:crypto';
    export const ABSURD_DEV_RELEASE_PREFIX = 'dev-';
    export const ABSURD_PROD_DEFAULT_SCHEMA = 'runtime_scheduler';
    export const ABSURD_QUEUE_SUFFIX_ENV = '${QUEUE_SUFFIX_ENV}';
    export const ABSURD_SCHEDULER_SCHEMA_ENV = '${SCHEMA_ENV}';
    export function stubNormalizeSuffix(value) {
      const folded = String(value).toLowerCase().split(/[^a-z0-9_]+/).join('_');
      let start = 0;
      let end = folded.length;
      while (start < end && folded[start] === '_') start += 1;
      while (end > start && folded[end - 1] === '_') end -= 1;
      return folded.substring(start, end).substring(0, 32);
    }
    export function resolveAbsurdQueueSuffix(env = process.env) {
      const raw = env[ABSURD_QUEUE_SUFFIX_ENV];
      return raw == null ? '' : stubNormalizeSuffix(raw);
    }
    export function absurdDevReleaseIdForQueueSuffix(suffix) {
      return ABSURD_DEV_RELEASE_PREFIX + suffix;
    }
    export function resolveAbsurdQueueSuffixForSchema(schema, env = process.env) {
      const wanted = (schema ?? '').trim();
      const own = (env[ABSURD_SCHEDULER_SCHEMA_ENV] ?? '').trim();
      if (wanted === '' || wanted === ABSURD_PROD_DEFAULT_SCHEMA || wanted === own) {
        return resolveAbsurdQueueSuffix(env);
      }
      return createHash('sha256').update(wanted, 'utf8').digest('hex').substring(0, 12);
    }
  `,
  '../runtime-scheduler-topology': `
    export function isIsolatedRuntimeSchedulerSchema(schema) {
      const value = (schema ?? '').trim();
      return value !== '' && value !== 'runtime_scheduler';
    }
  `,
  '../checkpoint-boundaries': `
    export function assertKnownResolvedBoundary(boundaryId, entry) {
      if (entry === undefined || entry === null) return undefined;
      const kind = entry.kind;
      if (kind === 'sleep' || kind === 'integration_event') return entry;
      const error = new Error('unknown boundary kind ' + String(kind) + ' for ' + boundaryId);
      error.name = 'UnknownBoundaryError';
      throw error;
    }
  `,
  '../runtime-capacity-policy': 'export const RUNTIME_CAPACITY_POLICY = {};',
  './postgres': `
    export function ensureAbsurdSchema() { throw new Error('stub: no database'); }
    export function failPostgresSchedulerScheduledChildWaits() { throw new Error('stub: no database'); }
  `,
  './absurd-pool': `export function createAbsurdForRuntimeScheduler() { throw new Error('stub'); }`,
  './postgres-pool': `
    export const RUNTIME_SCHEDULER_CONTROL_PLANE_MAX_CLIENTS = 2;
    export function resolveWorkflowRuntimePostgresUrl() { return undefined; }
    export function withRuntimeSchedulerClient() { throw new Error('stub: no database'); }
  `,
  './runtime-api-origin': `export function runtimeApiBaseUrlFromLaunch() { return ''; }`,
  './absurd-play-run-task': `
    export const ABSURD_PLAY_RUN_MAX_ATTEMPTS = 5;
    export const ABSURD_PLAY_RUN_RETRY_STRATEGY = {};
    export const ABSURD_PLAY_RUN_TASK = 'play-run';
  `,
};

async function loadReference() {
  const stubPlugin = {
    name: 'stubs',
    setup(build) {
      build.onResolve({ filter: /^[.@]/ }, (args) =>
        args.importer === seedPath || args.namespace === 'stub'
          ? { path: args.path, namespace: 'stub' }
          : undefined,
      );
      build.onLoad({ filter: /.*/, namespace: 'stub' }, (args) => ({
        contents: STUBS[args.path] ?? 'export {};',
        loader: 'js',
      }));
    },
  };
  const bundle = await esbuild.build({
    entryPoints: [seedPath],
    bundle: true,
    format: 'esm',
    platform: 'node',
    write: false,
    logLevel: 'silent',
    plugins: [stubPlugin],
  });
  const file = path.join(mkdtempSync(path.join(tmpdir(), 'lane-vectors-')), 'reference.mjs');
  writeFileSync(file, bundle.outputFiles[0].text);
  const topology = await import(
    `data:text/javascript,${encodeURIComponent(STUBS['../runtime-scheduler-topology'])}`
  );
  return { ref: await import(pathToFileURL(file).href), topology };
}

const { ref, topology } = await loadReference();

// ---------------------------------------------------------------------------------------------
// Python semantics, to find where JS and Python differ: str.strip() whitespace.
// ---------------------------------------------------------------------------------------------
const PY_WS = '\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const PY_STRIP = new RegExp(`^[${PY_WS}]+|[${PY_WS}]+$`, 'g');
const jsTrim = String.prototype.trim;
function pyStrip(s) {
  return s.replace(PY_STRIP, '');
}

function withPythonStrip(fn) {
  String.prototype.trim = function trim() {
    return pyStrip(String(this));
  };
  try {
    return fn();
  } finally {
    String.prototype.trim = jsTrim;
  }
}

function withEnv(env, fn) {
  for (const key of Object.keys(process.env)) delete process.env[key];
  Object.assign(process.env, env ?? {});
  const realNow = Date.now;
  Date.now = () => FIXED_NOW_MS;
  try {
    return fn();
  } finally {
    Date.now = realNow;
  }
}

// ---------------------------------------------------------------------------------------------
// Python function name -> a call of the reference.
// ---------------------------------------------------------------------------------------------
function mismatchOrConfig(a) {
  try {
    ref.absurdQueueNameForRelease(a.run_release_id);
    ref.absurdQueueNameForRelease(a.worker_release_id);
  } catch {
    return 'LaneConfigError';
  }
  return 'LaneMismatchError';
}

const FUNCTIONS = {
  normalize_queue_suffix: (a) => {
    // The reference's own normaliser is reached through the `dev-<x>` queue mapping.
    const queue = ref.absurdQueueNameForRelease(`dev-${a.raw}`);
    return queue === 'runs' ? '' : queue.slice('runs_'.length);
  },
  queue_suffix_from_env: (a) => ref.resolveAbsurdQueueSuffix(a.env),
  is_isolated_schema: (a) => topology.isIsolatedRuntimeSchedulerSchema(a.schema),
  worker_requires_queue_suffix: (a) => ref.absurdWorkerSchemaRequiresQueueSuffix(a.schema),
  queue_suffix_for_schema: (a) => ref.resolveAbsurdQueueSuffixForSchema(a.schema, a.env),
  sanitize_release_segment: (a) => {
    // Reached through the deploy-version path (which trims, then sanitises or throws on empty).
    if (!a.release_id.trim()) return '';
    try {
      return ref.currentAbsurdReleaseId({ [DEPLOY_ENV]: a.release_id });
    } catch {
      return '';
    }
  },
  current_release_id: (a) => ref.currentAbsurdReleaseId(a.env),
  launch_release_id: (a) => ref.currentAbsurdLaunchReleaseId(a.env),
  queue_name_for_release: (a) => ref.absurdQueueNameForRelease(a.release_id),
  release_id_for_suffix: (a) => ref.absurdReleaseIdForSuffix(a.explicit_suffix, a.env),
  release_id_for_launch: (a) => ref.absurdReleaseIdForLaunch(a.launch, a.env),
  queue_name_for_launch: (a) => ref.absurdQueueNameForLaunch(a.launch, a.env),
  runs_queue_for_suffix: (a) => ref.absurdRunsQueueForSuffix(a.suffix),
  is_runs_queue: (a) => ref.isAbsurdRunsQueue(a.name),
  assert_release_lane_matches: (a) => {
    ref.assertAbsurdReleaseLaneMatches({
      runId: a.run_id,
      runReleaseId: a.run_release_id,
      workerReleaseId: a.worker_release_id,
    });
    return null;
  },
  continuation_worker_id: (a) =>
    ref.absurdContinuationWorkerId({ workerBase: a.worker_base, queue: a.queue }),
  resolve_lane_disposition: (a) => {
    const d = ref.resolveAbsurdReleaseLaneDisposition({
      runId: a.run_id,
      runReleaseId: a.run_release_id,
      workerReleaseId: a.worker_release_id,
      laneClaiming: a.lane_claiming,
      parkedInAdoptableWait: a.parked_in_adoptable_wait,
    });
    const out = { kind: d.kind };
    if ('adoptedReleaseId' in d) out.adopted_release_id = d.adoptedReleaseId;
    if ('delaySeconds' in d) out.delay_seconds = d.delaySeconds;
    return out;
  },
  adoption_queues: (a) =>
    ref.absurdAdoptionQueuesForReleases({
      workerReleaseId: a.worker_release_id,
      adoptableReleaseIds: a.adoptable_release_ids,
    }),
  integration_event_name: (a) => ref.absurdIntegrationEventName(a.run_id, a.event_key),
  runner_terminal_event_name: (a) =>
    ref.absurdRunnerTerminalEventName(a.run_id, a.runner_attempt),
  integration_event_boundary_output: (a) =>
    ref.absurdIntegrationEventBoundaryOutput({
      eventKey: a.event_key,
      signalData: a.signal_data,
      messageRef: a.message_ref,
      timedOut: a.timed_out,
    }),
  checkpoint_base: (a) => ref.absurdCheckpointBase(a.checkpoint),
  boundary_resolved: (a) => ref.absurdBoundaryResolved(a.checkpoint, a.boundary_id),
  checkpoint_with_sleep: (a) =>
    ref.absurdCheckpointWithSleep(a.checkpoint, a.boundary_id, a.delay_ms),
  checkpoint_with_integration_event: (a) =>
    ref.absurdCheckpointWithIntegrationEvent({
      checkpoint: a.checkpoint,
      boundaryId: a.boundary_id,
      eventKey: a.event_key,
      timeoutMs: a.timeout_ms,
      messageRef: a.message_ref,
      output: a.output,
    }),
  terminal_ledger_event: (a) =>
    ref.absurdTerminalLedgerEvent({
      status: a.result.status,
      runId: a.result.runId,
      output: a.result.output,
      error: a.result.error,
    }),
};

// Which functions take `now_ms` in Python (the reference reads the clock; we freeze it).
const TAKES_NOW = new Set([
  'checkpoint_with_sleep',
  'checkpoint_with_integration_event',
  'terminal_ledger_event',
]);

function outcome(fnName, args) {
  try {
    const value = withEnv(args.env, () => FUNCTIONS[fnName](decodeArgs(args)));
    return { result: value };
  } catch (error) {
    if (error instanceof TypeError || error instanceof ReferenceError) throw error;
    let errorType = 'LaneConfigError';
    if (error.name === 'UnknownBoundaryError') errorType = 'UnknownBoundaryError';
    else if (fnName === 'assert_release_lane_matches') errorType = mismatchOrConfig(args);
    return { error: true, error_type: errorType };
  }
}

// Non-finite numbers cannot live in JSON: they travel as {"$float": "NaN" | "Infinity" | ...}.
function decodeArgs(value) {
  if (Array.isArray(value)) return value.map(decodeArgs);
  if (value && typeof value === 'object') {
    const keys = Object.keys(value);
    if (keys.length === 1 && keys[0] === '$float') return Number(value.$float);
    // Keep a null prototype (used to model Python dict lookups) and own `__proto__` keys.
    const out = Object.getPrototypeOf(value) === null ? Object.create(null) : {};
    for (const key of keys) {
      Object.defineProperty(out, key, {
        value: decodeArgs(value[key]),
        enumerable: true,
        writable: true,
        configurable: true,
      });
    }
    return out;
  }
  return value;
}

// ---------------------------------------------------------------------------------------------
// Inputs.
// ---------------------------------------------------------------------------------------------
const SHA = '3f786850e387550fdab836ed7e6dc881de23001b';
const A = (n) => 'a'.repeat(n);
const SANITIZED_MAIN = withEnv({}, () => ref.currentAbsurdReleaseId({ [DEPLOY_ENV]: `main-${SHA}` }));
const SANITIZED_LONG = withEnv({}, () => ref.currentAbsurdReleaseId({ [DEPLOY_ENV]: A(60) }));

const WHITESPACE = [
  '', ' ', '   ', '\t', '\n', '\r\n', ' \t\n ', '\u00a0', '\u3000', '\u2028', '\u2003',
  '\ufeff', ' \ufeff ', '\u0085', '\u001c', '\u001f', '\u200b', '\u180e', '\u000b\u000c',
];
const GARBAGE = [
  '!!!', '-', '---', '_', '___', '_a_', '__a__', '-a-', '.', '/', 'a/b', 'a..b', 'a b', 'a\tb',
  'a\nb', 'a__b', 'a_-_b', '$%^&*()', '@scope/pkg', 'x:y', 'a+b', '"quoted"', "it's", 'back\\slash',
  'null', 'undefined', '0', '00', '9lives', 'Z',
];
const UNICODE = [
  'café', 'CAFÉ', 'cafe\u0301', 'e\u0301', '\u0301', 'naïve-release', 'Ångström', '🚀', 'rel-🚀-1',
  '🚀🚀🚀', 'a🚀b', '👩‍💻', '发布-1', '版本', 'リリース', 'İstanbul', 'ISTANBUL', 'ı', 'İ', 'i̇',
  'straße', 'STRASSE', 'ẞ', 'ſ', 'ﬁx', '\u212aelvin', 'Ω', 'ΣΑΣ', 'Привет', 'x\u200by',
  'a\u0000b', '\ua7cbx', '\ud835\udc00bc', 'Ⅻ', '①②', '١٢٣', 'ＡＢＣ',
];
const OVERLONG = [
  A(31), A(32), A(33), `${A(31)}-b`, `${A(31)}--b`, `${A(32)}_`, `${'_'.repeat(40)}a`,
  `${A(30)}-${'b'.repeat(5)}`, `${'A'.repeat(33)}`, A(39), A(40), A(41), A(60), A(200),
  `${A(40)}!!!`, `${A(40)}_`, `${A(39)}é`, `${A(30)}_${'b'.repeat(20)}`,
  `${A(31)}_${'b'.repeat(20)}`, `${A(29)}__${'b'.repeat(20)}`, `${A(28)}---${'b'.repeat(20)}`,
  `${A(30)}-${'b'.repeat(10)}`, `${A(29)}-${'b'.repeat(11)}`, `${A(30)}🚀${'b'.repeat(10)}`,
  `${'A'.repeat(41)}`, ` ${A(41)} `, `${A(35)}é${'b'.repeat(10)}`, `${'ab-'.repeat(20)}`,
  `main-${SHA}`, `MAIN-${SHA.toUpperCase()}`, `main_${SHA}`, ` main-${SHA} `, `main-${SHA}-extra`,
  SANITIZED_MAIN, SANITIZED_LONG, `release/2024.06.01-${SHA}`,
];
const RELEASES = [
  'dev', 'dev-', 'dev-FOO', ' dev ', 'DEV', 'Dev', 'dev_', 'dev_foo', 'dev-foo', 'dev--foo',
  'dev- foo', 'dev-foo-bar', 'dev-!!!', 'dev-___', `dev-${A(40)}`, `dev-${'A'.repeat(33)}`,
  'devfoo', '-dev', 'dev\ufeff', 'dev\u0085', '\ufeffdev', 'dev-\ufeff', 'dev-é', 'dev-İ',
  'dev-\u212a', 'dev-pr_123', 'dev-PR-123', 'main', 'v1.2.3', 'v1.2.3+build.5',
  'feature/ABC-123_fix', 'release/2024.06.01', 'prod', 'runs', 'runs_x', `dev-${A(31)}-b`,
  `dev-${A(31)}_`, 'dev-feature-abcdefghijklmnopqrstuvw-xyz', '-dev-',
];
const STRINGS = [...WHITESPACE, ...GARBAGE, ...UNICODE, ...OVERLONG, ...RELEASES];
const NONBLANK = STRINGS.filter((s) => pyStrip(s) !== '' && s.trim() !== '');

const S = (v) => ({ [QUEUE_SUFFIX_ENV]: v });
const D = (v) => ({ [DEPLOY_ENV]: v });
const SCH = (v) => ({ [SCHEMA_ENV]: v });
const ENVS = [
  {}, { PATH: '/usr/bin', deepline_absurd_queue_suffix: 'lowercase-name-is-not-it' },
  S('pr-123'), S('PR 123'), S(''), S('  '), S('Feature/ABC'), S('___'), S('!!!'), S('\ufeff'),
  S('é'), S('İ'), S(A(40)), S(`${A(31)}-b`), S('dev'), S('\u0085x'),
  D(`main-${SHA}`), D(' v1.2.3 '), D(''), D('   '), D('!!!'), D('\ufeff'), D('\u0085'),
  D('\ufeffv1'), D('v1\u0085'), D('DEV'), D('dev'), D('dev-FOO'), D(A(60)), D('🚀'), D('🚀1'),
  D('İ'), D(SANITIZED_MAIN),
  { ...S('pr1'), ...D(`main-${SHA}`) }, { ...S(''), ...D('v1') }, { ...S('!!!'), ...D('v1') },
  { ...S('  '), ...D('!!!') }, { ...S('\ufeff'), ...D('v2') }, { ...S('x'), ...D('') },
  SCH('pr_123'), { ...SCH('pr_123'), ...S('pr-123') }, { ...SCH('runtime_scheduler'), ...D('v9') },
  { ...SCH(' PR-123 '), ...S('abc'), ...D('v3') },
];

const SCHEMAS = [
  null, '', '  ', '\t', 'runtime_scheduler', ' runtime_scheduler ', 'RUNTIME_SCHEDULER',
  'runtime_scheduler_x', 'runtime-scheduler', 'pr_123', 'PR-123', ' pr_123 ', 'pr_124', 'public',
  'é', '🚀', 'schema with space', '\ufeff', '\ufeffruntime_scheduler', '\u0085',
  'runtime_scheduler\u0085', '\u00a0pr_123\u00a0', 'x', A(63), '"quoted"', 'runtime_scheduler\n',
  '\nruntime_scheduler', 'runtime_schedulerx', 'runtime scheduler', 'Runtime_Scheduler',
  '_runtime_scheduler', 'runtime_scheduler_', 'pr-1', 'preview_abc', 'wt_feature_x', 'public ',
  '0', 'null', 'RUNTIME-SCHEDULER', '\u3000runtime_scheduler\u3000', '\u001cpr',
  'runtime_scheduler\u200b',
];

// ---------------------------------------------------------------------------------------------
// Vector sets per function.
// ---------------------------------------------------------------------------------------------
const uniq = (xs) => [...new Map(xs.map((x) => [JSON.stringify(x), x])).values()];

const ID_PAIRS = [
  ['dev', 'dev'], ['dev', ' dev '], [' dev ', 'dev'], ['DEV', 'dev'], ['dev', 'DEV'],
  ['dev-pr1', 'dev-PR1'], ['dev-pr1', 'dev-pr2'], ['dev-pr1', 'dev-pr1 '], ['dev-', 'dev'],
  ['dev-!!!', 'dev'], ['dev-foo', 'dev_foo'], ['dev-FOO', 'dev_foo'], ['', ''], ['  ', '  '],
  ['', 'dev'], ['dev', ''], ['  ', 'dev'], ['!!!', '!!!'], ['!!!', '???'], ['!!!', 'dev'],
  ['v1', 'v2'], ['v1', 'v1'], ['V1', 'v1'], ['v1.2', 'v1_2'], ['v1.2', 'v1-2'],
  [`main-${SHA}`, SANITIZED_MAIN], [SANITIZED_MAIN, `main-${SHA}`], [`main-${SHA}`, `main-${SHA}`],
  [`main-${SHA}`, `main_${SHA}`], [`MAIN-${SHA.toUpperCase()}`, SANITIZED_MAIN],
  [A(60), SANITIZED_LONG], [A(41), A(42)], [A(40), `${A(40)}_`], ['café', 'caf_'],
  ['café', 'cafe'], ['🚀1', '_1'], ['İ', 'i'], ['\u212a', 'k'], ['dev\ufeff', 'dev'],
  ['dev\u0085', 'dev'], ['\ufeff', 'dev'], ['\u0085', '\u0085'], ['prod', 'runs_prod'],
  ['dev-runs', 'runs'],
];

const vectors = {
  normalize_queue_suffix: STRINGS.map((raw) => ({ raw })),
  queue_suffix_from_env: uniq([
    ...ENVS.map((env) => ({ env })),
    ...[...WHITESPACE, ...GARBAGE.slice(0, 12), ...UNICODE.slice(0, 20), ...OVERLONG.slice(0, 10)]
      .map((v) => ({ env: S(v) })),
  ]),
  is_isolated_schema: SCHEMAS.map((schema) => ({ schema })),
  worker_requires_queue_suffix: SCHEMAS.map((schema) => ({ schema })),
  queue_suffix_for_schema: uniq(
    SCHEMAS.filter((s) => s !== null).flatMap((schema) =>
      [{}, S('pr-123'), { ...SCH('pr_123'), ...S('Wt 7') }, SCH(' PR-123 ')].map(
        (env) => ({ schema, env }),
      ),
    ),
  ),
  sanitize_release_segment: STRINGS.map((release_id) => ({ release_id })),
  current_release_id: ENVS.map((env) => ({ env })),
  launch_release_id: ENVS.map((env) => ({ env })),
  queue_name_for_release: STRINGS.map((release_id) => ({ release_id })),
  release_id_for_suffix: uniq(
    [
      undefined, null, '', '  ', '\t', 'pr-123', 'PR 123', 'Feature/ABC', '!!!', '___', 'é',
      '\ufeff', '\u0085', ' x ', A(40), 'dev', 'runs',
    ].flatMap((explicit_suffix) =>
      [{}, S('wt-7'), D(`main-${SHA}`), { ...S('wt-7'), ...D('v1') }, D('!!!'), S('!!!')].map(
        (env) => (explicit_suffix === undefined ? { env } : { explicit_suffix, env }),
      ),
    ),
  ),
  release_id_for_launch: uniq(
    [
      {}, { absurdReleaseId: null }, { absurdReleaseId: '' }, { absurdReleaseId: '  ' },
      { absurdReleaseId: ' v7 ' }, { absurdReleaseId: `main-${SHA}` },
      { absurdReleaseId: 'dev' }, { absurdReleaseId: 'DEV' }, { absurdReleaseId: 'dev-pr1' },
      { absurdReleaseId: '!!!' }, { absurdReleaseId: '\ufeff' }, { absurdReleaseId: '\u0085' },
      { absurdReleaseId: '\ufeffv7\ufeff' }, { absurdReleaseId: 'v7\u0085' },
      { absurdReleaseId: A(60) }, { absurdReleaseId: 'v7', other: 'ignored' },
    ].flatMap((launch) =>
      [{}, S('wt-7'), D(`main-${SHA}`), D('!!!'), D('\ufeff')].map((env) => ({ launch, env })),
    ),
  ),
  queue_name_for_launch: null, // same inputs as release_id_for_launch, filled below
  runs_queue_for_suffix: uniq(
    [
      undefined, null, '', '  ', 'pr-123', 'PR 123', '!!!', '___', 'é', '🚀', '\ufeff', '\u0085',
      A(40), `${A(31)}-b`, 'runs', 'İ',
    ].flatMap((suffix) =>
      [{}, S('wt-7'), S('!!!'), D('v1')].map((env) =>
        suffix === undefined ? { env } : { suffix, env },
      ),
    ),
  ),
  is_runs_queue: [
    'runs', 'runs_', 'runs_x', 'runs__', 'runs_runs', 'RUNS', 'Runs_x', ' runs', 'runs ', 'runsx',
    'run', 'run_s', '', ' ', 'runs-x', 'xruns_', 'runs.x', 'runs\u0000', 'runs_é', 'runs_🚀', '_runs',
    'runs\n', 'r', 'runs_pr_123', `runs_${SANITIZED_MAIN}`, 'queue', 'default', 'runs_1',
    'runs_dev', 'runsruns', 'runs_ ', 'RUNS_x', 'runs\t', '\truns', 'runs_\u0000', 'rUns',
    'runs__x', 'runs_-', 'runs_x_y', `runs_${A(40)}`, 'runs:continuations', 'absurd.runs',
    'runs_\u00fc', '\uff52\uff55\uff4e\uff53', 'runs_runs_runs', 'runs\u200b', 'r_uns',
  ].map((name) => ({ name })),
  assert_release_lane_matches: ID_PAIRS.map(([run_release_id, worker_release_id], i) => ({
    run_id: `run-${i}`,
    run_release_id,
    worker_release_id,
  })),
  continuation_worker_id: uniq(
    [
      ['host-1', 'runs'], ['host-1', 'runs_v1'], ['', ''], ['', 'runs'], ['host', ''],
      ['host:1', 'runs_a'], ['fly-machine-123:pid-9', `runs_${SANITIZED_MAIN}`], [' a ', ' b '],
      ['é', '🚀'], ['a:continuations', 'runs'], ['host', 'runs:continuations'],
      ...STRINGS.slice(0, 30).map((s) => [s, 'runs_x']),
    ].map(([worker_base, queue]) => ({ worker_base, queue })),
  ),
  resolve_lane_disposition: ID_PAIRS.flatMap(([run_release_id, worker_release_id], i) =>
    [
      [true, true], [true, false], [false, true], [false, false],
    ].map(([lane_claiming, parked_in_adoptable_wait]) => ({
      run_id: `run-${i}`,
      run_release_id,
      worker_release_id,
      lane_claiming,
      parked_in_adoptable_wait,
    })),
  ),
  adoption_queues: [
    ['v3', []], ['v3', ['v1']], ['v3', ['v1', 'v2']], ['v3', ['v2', 'v1', 'v2']], ['v3', ['v3']],
    ['v3', ['V3', ' v3 ', 'v1']], ['dev', ['dev']], ['dev', ['dev', 'DEV', ' dev ']],
    ['dev', ['dev-pr1', 'dev-PR1', 'dev-pr2']], ['dev-pr1', ['dev-pr1', 'dev-pr2']],
    ['v3', ['', '  ', '\t', 'v1']], ['v3', ['\ufeff', 'v1']], ['v3', ['\u0085', 'v1']],
    ['v3', [`main-${SHA}`, SANITIZED_MAIN]], [SANITIZED_MAIN, [`main-${SHA}`, 'v1']],
    [`main-${SHA}`, [SANITIZED_MAIN, 'v1']], ['v3', ['!!!']], ['v3', ['v1', '!!!']],
    ['', ['v1']], ['  ', []], ['!!!', []], ['v3', ['b', 'a', 'c', 'a_', 'A']],
    ['v3', ['z', 'runs', 'a']], ['v3', [A(60), A(61), SANITIZED_LONG]], ['v3', ['café', 'cafe']],
    ['v3', ['🚀1', '🚀2']], ['v3', ['dev', 'dev-', 'dev-!!!']], ['v3', ['dev-x', 'dev_x']],
    ['v3', ['İ', 'i', '\u212a', 'k']], ['v3', ['v1.2', 'v1-2', 'v1_2']],
    ['v3', ['x-y', 'x_y', 'x.y', 'x y', 'xy']], ['v3', ['dev\ufeff', 'dev']],
    ['v3', ['dev\u0085', 'dev']], ['dev', ['\ufeffdev', 'dev-x']], ['v3', ['Z', 'a', '_b', 'B']],
    ['v3', ['runs_10', 'runs_9', '10', '9', '1_0']], ['v3', ['a'.repeat(40), `${A(40)}_`]],
    ['v3', ['release/2024', 'release-2024', 'Release 2024']], ['V3', ['v3']],
    ['dev-pr1', ['dev']], ['dev', ['dev-']], ['dev-', ['dev']], ['v3', ['  v1  ', 'v1']],
  ].map(([worker_release_id, adoptable_release_ids]) => ({
    worker_release_id,
    adoptable_release_ids,
  })),
  integration_event_name: [
    ['run-1', 'approved'], ['', ''], ['run-1', ''], ['', 'k'], ['r:1', 'a:b'], ['run 1', 'key x'],
    ['é', '🚀'], ['  ', '  '], ['evt:run', 'evt:key'], ['00000000-0000-0000-0000-000000000001', 'x'],
    ...STRINGS.slice(0, 32).map((s) => ['run-7', s]),
  ].map(([run_id, event_key]) => ({ run_id, event_key })),
  runner_terminal_event_name: [
    ...[0, 1, 2, 10, 99, 12345, -1, 2 ** 31, 2 ** 53 - 1].map((n) => ['run-1', n]),
    ...STRINGS.slice(0, 32).map((s) => [s, 3]),
  ].map(([run_id, runner_attempt]) => ({ run_id, runner_attempt })),
  integration_event_boundary_output: null, // below: some need raw key order
  checkpoint_base: null, // below
  boundary_resolved: null, // below
  checkpoint_with_sleep: null,
  checkpoint_with_integration_event: null,
  terminal_ledger_event: [
    { status: 'completed', runId: 'r1', output: { a: 1 }, error: null },
    { status: 'completed', runId: 'r1', output: null, error: null },
    { status: 'completed', runId: 'r1', output: [1, 2], error: 'ignored' },
    { status: 'completed', runId: 'r1', output: 'text', error: null },
    { status: 'failed', runId: 'r2', output: null, error: 'boom' },
    { status: 'failed', runId: 'r2', output: { partial: true }, error: 'boom' },
    { status: 'failed', runId: 'r2', output: null, error: null },
    { status: 'idle', runId: 'r3', output: null, error: null },
    { status: 'running', runId: 'r3', output: null, error: null },
    { status: 'cancelled', runId: 'r3', output: null, error: null },
    { status: 'COMPLETED', runId: 'r3', output: null, error: null },
    { status: '', runId: 'r3', output: null, error: null },
    { status: 'completed', runId: '', output: 0, error: null },
    { status: 'failed', runId: 'é', output: null, error: '' },
  ].map((result) => ({ result, now_ms: FIXED_NOW_MS })),
};
vectors.queue_name_for_launch = vectors.release_id_for_launch;

// checkpoint_base: non-dicts, nulls, passthrough, epochs, mapFrames.
const F = (v) => ({ $float: v });
const CHECKPOINTS = [
  null, [], [1, 2], 'checkpoint', 0, 1, true, false, {},
  { completedBatches: { b1: 1 } },
  { completedBatches: null, completedToolBatches: null, resolvedWaterfalls: null, resolvedBoundaries: null },
  { completedBatches: false, completedToolBatches: 0, resolvedWaterfalls: '', resolvedBoundaries: [] },
  { completedBatches: [1], resolvedBoundaries: 'x' },
  { futureField: { nested: [1, 2] }, another: null, resolvedBoundaries: { s: { kind: 'sleep' } } },
  { durableCallCacheEpochMs: 0 }, { durableCallCacheEpochMs: 1700000000000 },
  { durableCallCacheEpochMs: 1.5 }, { durableCallCacheEpochMs: -1 },
  { durableCallCacheEpochMs: -0.5 }, { durableCallCacheEpochMs: '5' },
  { durableCallCacheEpochMs: true }, { durableCallCacheEpochMs: false },
  { durableCallCacheEpochMs: null }, { durableCallCacheEpochMs: [] },
  { durableCallCacheEpochMs: {} }, { durableCallCacheEpochMs: F('NaN') },
  { durableCallCacheEpochMs: F('Infinity') }, { durableCallCacheEpochMs: F('-Infinity') },
  { durableCallCacheEpochMs: 1e300 }, { durableCallCacheEpochMs: 2 ** 53 + 2 },
  { mapFrames: {} }, { mapFrames: { f: { i: 1 } } }, { mapFrames: [] }, { mapFrames: null },
  { mapFrames: 'frames' }, { mapFrames: 0 }, { mapFrames: [{ a: 1 }] },
  { mapFrames: { a: 1 }, durableCallCacheEpochMs: 5, x: 1 },
  { z: 1, a: 2, completedBatches: { k: 1 }, m: [null] },
  { resolvedBoundaries: { b: { kind: 'integration_event', output: { x: 1 } } } },
  { completedToolBatches: { t: [1] }, resolvedWaterfalls: { w: 'x' } },
  { durableCallCacheEpochMs: 0, mapFrames: { a: {} }, completedBatches: {} },
  { '': 'empty key', ' ': 'space key' }, { 'é': 1, '🚀': 2 },
];

vectors.checkpoint_base = CHECKPOINTS.map((checkpoint) => ({ checkpoint }));

const RB = (entries) => ({ resolvedBoundaries: entries });
const BOUNDARY_CASES = [
  [null, 'b'], [{}, 'b'], ['x', 'b'], [[], 'b'], [RB(null), 'b'], [RB({}), 'b'],
  [RB({ b: { kind: 'sleep' } }), 'b'], [RB({ b: { kind: 'integration_event' } }), 'b'],
  [RB({ b: { kind: 'sleep', delayMs: 5, completedAt: 1 } }), 'b'],
  [RB({ b: { kind: 'sleep' } }), 'c'], [RB({ b: { kind: 'sleep' } }), 'B'],
  [RB({ b: { kind: 'sleep' } }), ' b'], [RB({ b: { kind: 'SLEEP' } }), 'b'],
  [RB({ b: { kind: 'sleep ' } }), 'b'], [RB({ b: { kind: 'timer' } }), 'b'],
  [RB({ b: { kind: 'runPlay' } }), 'b'], [RB({ b: { kind: '' } }), 'b'],
  [RB({ b: { kind: null } }), 'b'], [RB({ b: { kind: 1 } }), 'b'], [RB({ b: {} }), 'b'],
  [RB({ b: { delayMs: 5 } }), 'b'], [RB({ b: null }), 'b'], [RB({ b: 'sleep' }), 'b'],
  [RB({ b: ['sleep'] }), 'b'], [RB({ b: 0 }), 'b'], [RB({ b: true }), 'b'],
  [RB({ b: { kind: 'timer' } }), 'other'], [RB({ '': { kind: 'sleep' } }), ''],
  [RB({ 'é': { kind: 'sleep' } }), 'é'], [RB({ '🚀': { kind: 'integration_event' } }), '🚀'],
  [RB({ '1': { kind: 'sleep' } }), '1'], [{ other: 1, ...RB({ b: { kind: 'sleep' } }) }, 'b'],
  [{ resolvedBoundaries: { a: { kind: 'sleep' }, b: { kind: 'nope' } } }, 'a'],
  [{ resolvedBoundaries: { a: { kind: 'sleep' }, b: { kind: 'nope' } } }, 'b'],
  [{}, 'toString'], [{}, 'constructor'], [{}, 'hasOwnProperty'], [{}, '__proto__'],
  [RB({}), 'valueOf'], [RB({ b: { kind: 'sleep' } }), 'isPrototypeOf'], [null, 'toString'],
  [RB({ toString: { kind: 'sleep' } }), 'toString'],
  [RB({ constructor: { kind: 'nope' } }), 'constructor'], [RB([]), 'b'], [RB('x'), 'b'],
  [RB({ b: { kind: [] } }), 'b'], [RB({ b: { kind: ['sleep'] } }), 'b'],
  [RB({ b: { kind: {} } }), 'b'], [RB({ b: { kind: { sleep: true } } }), 'b'],
  [RB({ b: { kind: true } }), 'b'],
  [RB(false), 'b'], [RB(0), 'b'],
];
vectors.boundary_resolved = BOUNDARY_CASES.map(([checkpoint, boundary_id]) => ({
  checkpoint,
  boundary_id,
}));

vectors.checkpoint_with_sleep = [
  [null, 'b', 1000], [{}, 'b', 0], [RB({ a: { kind: 'sleep', delayMs: 1 } }), 'b', 5],
  [RB({ b: { kind: 'integration_event', timeoutPolicy: 'x' } }), 'b', 7],
  [{ future: 1, durableCallCacheEpochMs: -1, mapFrames: [] }, 's', 60000],
  [RB(null), 'é', 1], ['junk', 'b', 2.5], [RB({ b: { kind: 'sleep', delayMs: 9, extra: 1 } }), 'b', 3],
  [{ completedBatches: { x: 1 }, resolvedBoundaries: { z: { kind: 'nope' } } }, 'b', 4],
].map(([checkpoint, boundary_id, delay_ms]) => ({
  checkpoint,
  boundary_id,
  delay_ms,
  now_ms: FIXED_NOW_MS,
}));

const MSG = { channel: 'C1', ts: '1700000000.0001' };
vectors.checkpoint_with_integration_event = [
  [null, 'b', 'approved', 1000, undefined, { resumed: true }],
  [{}, 'b', 'approved', 0, MSG, { resumed: false }],
  [{}, 'b', 'approved', 0, null, {}],
  [RB({ b: { kind: 'integration_event', timeoutPolicy: 'resume', eventKey: 'old', extra: [1] } }),
    'b', 'approved', 5, undefined, { x: 1 }],
  [RB({ b: { kind: 'integration_event', messageRef: MSG, completedAt: 1 } }), 'b', 'k', 5,
    undefined, { y: 2 }],
  [RB({ b: { kind: 'integration_event', messageRef: MSG } }), 'b', 'k', 5, { channel: 'C2', ts: '2' },
    {}],
  [RB({ b: { kind: 'sleep', delayMs: 3, timeoutPolicy: 'x' } }), 'b', 'k', 5, undefined, {}],
  [RB({ b: { kind: 'nope', timeoutPolicy: 'x' } }), 'b', 'k', 5, undefined, {}],
  [RB({ b: null }), 'b', 'k', 5, undefined, {}],
  [RB({ a: { kind: 'sleep' } }), 'b', 'k', 5, MSG, { nested: { deep: [1, { z: null }] } }],
  [{ keep: 'me', mapFrames: {}, durableCallCacheEpochMs: 3 }, 'w', 'é', 10, undefined, {}],
  [{}, 'b', 'k', 1, {}, {}],
  [RB({ b: { kind: 'integration_event', messageRef: MSG } }), 'b', 'k', 1, {}, {}],
].map(([checkpoint, boundary_id, event_key, timeout_ms, message_ref, output]) => {
  const args = { checkpoint, boundary_id, event_key, timeout_ms };
  if (message_ref !== undefined) args.message_ref = message_ref;
  return { ...args, output, now_ms: FIXED_NOW_MS };
});

const OUTPUT_CASES = [];
for (const timed_out of [true, false]) {
  for (const signal_data of [
    null, {}, { a: 1 }, { approved: true, by: 'ann' }, { resumed: 'from-data', z: 1 },
    { timed_out: 'x', signal: 'y', event_key: 'z', message_ref: 'm', event_payload: 'p', response: 'r' },
    { nested: { deep: [1, 2] }, list: [], nil: null }, { 'é': '🚀' }, { '': 'empty' },
  ]) {
    for (const message_ref of [undefined, null, MSG, {}]) {
      OUTPUT_CASES.push({ event_key: 'approved', signal_data, message_ref, timed_out });
    }
  }
  for (const event_key of ['', ' ', 'é', 'a:b', 'evt:run:key']) {
    OUTPUT_CASES.push({ event_key, signal_data: { k: 1 }, timed_out });
  }
}
vectors.integration_event_boundary_output = OUTPUT_CASES.map((c) => {
  const args = { event_key: c.event_key, signal_data: c.signal_data };
  if (c.message_ref !== undefined) args.message_ref = c.message_ref;
  args.timed_out = c.timed_out;
  return args;
});

// Signal data whose key order JS and Python enumerate differently (integer-like keys first in JS).
// Written to the file in its original text order, which is the order Python sees.
const RAW_SIGNAL_DATA = [
  ['{"z":1,"10":2,"a":3,"2":4}', ['z', '10', 'a', '2']],
  ['{"b":1,"0":0}', ['b', '0']],
  ['{"x":1,"01":2,"1":3}', ['x', '01', '1']],
];

// ---------------------------------------------------------------------------------------------
// Run, annotate, write.
// ---------------------------------------------------------------------------------------------
const LOWERCASE_NOTES = [
  ['\u0130', 'U+0130 (dotted capital I) lowercases to "i" + U+0307 in both JS toLowerCase() and ' +
    'Python str.lower(), so it sanitises to "i_"; a Turkish-locale lower() or an ASCII-only ' +
    'expectation of plain "i" would differ'],
  ['\u212a', 'U+212A (Kelvin sign) lowercases to ASCII "k" in both JS and Python'],
  ['ß', 'ß: JS toLowerCase() and str.lower() keep it (sanitised to "_"); str.casefold() gives "ss"'],
  ['ẞ', 'U+1E9E: lower() gives "ß" in JS and Python (sanitised to "_"); casefold() gives "ss"'],
  ['ſ', 'U+017F (long s): lower() keeps it (sanitised to "_"); casefold() gives "s"'],
  ['ﬁ', 'U+FB01 (fi ligature): lower() keeps it (sanitised to "_"); casefold() gives "fi"'],
  ['\ua7cb', 'U+A7CB lowercases to U+0264 in Node 20 (Unicode 17) but is unassigned (unchanged) ' +
    'in Python 3.11 (Unicode 14); both are outside [a-z0-9_], so the sanitised result agrees'],
  ['ı', 'U+0131 (dotless i) stays non-ASCII in both languages (sanitised to "_")'],
];

function stringsIn(value, out = []) {
  if (typeof value === 'string') out.push(value);
  else if (Array.isArray(value)) for (const v of value) stringsIn(v, out);
  else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      out.push(k);
      stringsIn(v, out);
    }
  }
  return out;
}

const hex = (s) =>
  [...s].map((c) => `U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}`).join(' ');

function trimNote(strings) {
  const differing = strings.filter((s) => s.trim() !== pyStrip(s));
  if (!differing.length) return null;
  const chars = new Set();
  for (const s of differing) for (const c of s) if (jsTrim.call(c) !== pyStrip(c)) chars.add(c);
  return `JS trim() and Python str.strip() treat ${hex([...chars].join(''))} differently ` +
    '(JS trims only U+FEFF of these; Python strips U+001C-U+001F and U+0085)';
}

function pythonSemanticsArgs(fnName, args) {
  // Python dict lookups see no inherited keys: model that with null-prototype boundary maps.
  if (fnName !== 'boundary_resolved') return args;
  const cp = args.checkpoint;
  const isRecord = cp && typeof cp === 'object' && !Array.isArray(cp);
  const rb = isRecord ? cp.resolvedBoundaries : undefined;
  const bare = Object.assign(Object.create(null), rb && typeof rb === 'object' ? rb : {});
  return { ...args, checkpoint: { ...(isRecord ? cp : {}), resolvedBoundaries: bare } };
}

const out = {};
let divergent = 0;
for (const [fnName, list] of Object.entries(vectors)) {
  out[fnName] = uniq(list).map((args) => {
    const vector = { args, ...outcome(fnName, args) };
    if (TAKES_NOW.has(fnName) && !('now_ms' in args)) throw new Error(`${fnName} needs now_ms`);
    if (fnName === 'integration_event_boundary_output' && !vector.error) {
      vector.key_order = Object.keys(vector.result);
    }
    const notes = [];
    const strings = stringsIn(args);
    for (const [ch, note] of LOWERCASE_NOTES) {
      if (strings.some((s) => s.includes(ch))) notes.push(note);
    }
    const pyArgs = pythonSemanticsArgs(fnName, args);
    const pyOutcome = withPythonStrip(() => outcome(fnName, pyArgs));
    const tNote = trimNote(strings);
    const jsKey = JSON.stringify({ ...vector, args: undefined, key_order: undefined });
    const pyKey = JSON.stringify(pyOutcome);
    if (jsKey !== pyKey) {
      divergent += 1;
      vector.divergence = pyArgs === args ? 'trim' : 'js-inherited-property';
      vector.design_rule = pyOutcome;
      notes.push(
        pyArgs === args
          ? `${tNote}; the reference gives ${JSON.stringify(vector.error ? vector.error_type : vector.result)}, ` +
              `the same rule with str.strip() gives ${JSON.stringify(pyOutcome.error ? pyOutcome.error_type : pyOutcome.result)}`
          : `the reference looks the boundary id up on a plain JS object and finds an inherited ` +
              `Object.prototype member, so it reports an unknown boundary; a dict lookup finds nothing ` +
              `and gives ${JSON.stringify(pyOutcome.result)}`,
      );
    } else if (tNote) {
      notes.push(`${tNote}, without changing this result`);
    }
    if (notes.length) vector.note = notes.join('; ');
    return vector;
  });
}

// Raw JSON text spliced into the file in place of a placeholder string.
const RAW = [];
function raw(text) {
  RAW.push(text);
  return `@@RAW${RAW.length - 1}@@`;
}

// Raw-order signal data for integration_event_boundary_output.
for (const [text, textOrder] of RAW_SIGNAL_DATA) {
  for (const timed_out of [false, true]) {
    const args = { event_key: 'k', signal_data: JSON.parse(text), timed_out };
    const vector = { args, ...outcome('integration_event_boundary_output', args) };
    vector.key_order = Object.keys(vector.result);
    const fixed = Object.keys(vector.result).filter((k) => !(k in args.signal_data));
    const pyOrder = timed_out ? vector.key_order : [...textOrder, ...fixed];
    if (JSON.stringify(pyOrder) !== JSON.stringify(vector.key_order)) {
      divergent += 1;
      vector.divergence = 'key-order';
      vector.design_rule = { result: vector.result, key_order: pyOrder };
      vector.note =
        'JS enumerates integer-like keys first, so the reference output starts with ' +
        `${JSON.stringify(vector.key_order.slice(0, textOrder.length))}; a Python dict keeps the ` +
        `signal data's own order ${JSON.stringify(textOrder)}`;
    }
    vector.args = { ...args, signal_data: raw(text) };
    out.integration_event_boundary_output.push(vector);
  }
}

// Numbers JSON can carry but a JS number cannot: JSON.parse turns them into +-Infinity.
const BIG = `1${'0'.repeat(400)}`;
for (const text of [BIG, `-${BIG}`, '1e400']) {
  const args = { checkpoint: { durableCallCacheEpochMs: JSON.parse(text), keep: 1 } };
  const vector = { args, ...outcome('checkpoint_base', args) };
  vector.args = { checkpoint: { durableCallCacheEpochMs: raw(text), keep: 1 } };
  if (text === BIG) {
    divergent += 1;
    vector.divergence = 'number-range';
    vector.design_rule = { result: { ...vector.result, durableCallCacheEpochMs: raw(text) } };
    vector.note =
      'JSON.parse reads this integer as Infinity, so the reference drops the epoch; Python ' +
      'reads an exact int, which is a finite number >= 0 under the DESIGN.md rule';
  }
  out.checkpoint_base.push(vector);
}

// Sanity: the stub's suffix normaliser must agree with the reference's own normaliser.
for (const { args, result } of out.normalize_queue_suffix) {
  const viaStub = ref.resolveAbsurdQueueSuffix({ [QUEUE_SUFFIX_ENV]: args.raw });
  if (viaStub !== result) throw new Error(`stub normaliser disagrees on ${JSON.stringify(args.raw)}`);
}

const seedSha = createHash('sha256').update(readFileSync(seedPath)).digest('hex');
const meta = {
  reference: 'shared/seed/absurd-shared.ts',
  reference_sha256: seedSha,
  node: process.version,
  unicode: process.versions.unicode,
  now_ms: FIXED_NOW_MS,
};

const asciiJson = (value) =>
  JSON.stringify(value).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
const sections = [`  "_meta": ${asciiJson(meta)}`];
for (const [fnName, list] of Object.entries(out)) {
  const lines = list.map((v) => `    ${asciiJson(v)}`).join(',\n');
  sections.push(`  ${JSON.stringify(fnName)}: [\n${lines}\n  ]`);
}
let text = `{\n${sections.join(',\n')}\n}\n`;
RAW.forEach((rawText, i) => {
  text = text.split(`"@@RAW${i}@@"`).join(rawText);
});
JSON.parse(text);
writeFileSync(outPath, text);

const counts = Object.fromEntries(Object.entries(out).map(([k, v]) => [k, v.length]));
console.log(JSON.stringify({ out: outPath, counts, divergent, seedSha }, null, 1));
