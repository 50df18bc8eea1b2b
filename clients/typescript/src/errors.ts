// The refusals of lane-worker's SQL API as typed errors, by SQLSTATE (store
// migration 0008): 22023 bad input, 23505 an idempotency key that names
// another request, P0002 an unknown run. Anything else is a LaneError that
// keeps its code and message.
//
// An error carries only what it names here: never the pg error object (a
// connection failure's can hold the connection string) and never the values a
// call sent. Known secrets (the connection string's password, a runtime API's
// tokens) are masked in every message and detail, should the server or a
// library echo one.

import type { RunReport } from './types.js';

/** Any failure of a lane-worker call: a refusal of the SQL API, a connection failure, a timeout. */
export class LaneError extends Error {
  /**
   * The SQLSTATE of a database refusal (`22023`, `40001` ...), Node's code of a
   * connection failure (`ECONNREFUSED` ...), or undefined.
   */
  readonly code: string | undefined;
  /** The refusal's DETAIL, when the server gave one. */
  readonly detail: string | undefined;

  constructor(message: string, code?: string, detail?: string) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.detail = detail;
  }
}

/** 22023: the request is unusable; the message says which argument and why. Nothing was written. */
export class BadInputError extends LaneError {}

/**
 * 23505 (constraint `idempotency_key`): the key already names another request
 * (another play, input or lane). `existingRunId` is the run the key names.
 */
export class IdempotencyConflictError extends LaneError {
  readonly existingRunId: string;

  constructor(message: string, existingRunId: string) {
    super(message, '23505', existingRunId);
    this.existingRunId = existingRunId;
  }
}

/** P0002: no such run (or, for a runner result, no such runner attempt of the run). */
export class UnknownRunError extends LaneError {}

/** `wait` saw no end before its timeout; `last` is the run's status when it gave up. */
export class WaitTimeoutError extends LaneError {
  readonly last: RunReport;

  constructor(message: string, last: RunReport) {
    super(message);
    this.last = last;
  }
}

const MASK = '***';

/** Return `text` with every secret of `secrets` (at least 4 characters long) replaced by ***. */
export function masked(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const secret of secrets) {
    // A secret shorter than 4 characters would mask unrelated words: no token is that short.
    if (secret.length >= 4) out = out.split(secret).join(MASK);
  }
  return out;
}

interface PgErrorFields {
  code?: unknown;
  message?: unknown;
  detail?: unknown;
  constraint?: unknown;
}

/** Return the typed error for what a query threw, its message and detail masked. */
export function fromDatabase(thrown: unknown, secrets: readonly string[]): LaneError {
  if (thrown instanceof LaneError) return thrown;
  const fields: PgErrorFields =
    typeof thrown === 'object' && thrown !== null ? (thrown as PgErrorFields) : {};
  const code = typeof fields.code === 'string' ? fields.code : undefined;
  const rawMessage =
    typeof fields.message === 'string' && fields.message !== '' ? fields.message : String(thrown);
  const message = masked(rawMessage, secrets);
  const detail =
    typeof fields.detail === 'string' ? masked(fields.detail, secrets) : undefined;
  switch (code) {
    case '22023':
      return new BadInputError(message, code, detail);
    case '23505':
      if (fields.constraint === 'idempotency_key' && detail !== undefined) {
        return new IdempotencyConflictError(message, detail);
      }
      return new LaneError(message, code, detail);
    case 'P0002':
      return new UnknownRunError(message, code, detail);
    default:
      return new LaneError(message, code, detail);
  }
}
