// @lane-worker/client: lane-worker's SQL API from TypeScript (see README.md).
export {
  DEFAULT_SCHEMA,
  LaneClient,
  checkedSchema,
  type LaneClientOptions,
  type Queryable,
  type SqlType,
  type WaitOptions,
} from './client.js';
export {
  BadInputError,
  IdempotencyConflictError,
  LaneError,
  UnknownRunError,
  WaitTimeoutError,
} from './errors.js';
export * from './types.js';
