/**
 * Typed errors. zygoted answers failures with `{"error": {"code", "message"}}`
 * and a stable `code`; {@link errorFor} maps the code to a class so callers
 * can use `instanceof SandboxNotFound` instead of comparing strings. Every
 * error keeps the original `code` (and HTTP `status` when there was one).
 */
import type { BranchFailure, CommandResult, MergeConflict, MergeReport } from "./models.js";
import type { Sandbox } from "./sandbox.js";

export class ZygoteError extends Error {
  static readonly defaultCode: string = "error";
  /** The API's stable error code, or an SDK code such as `command_timeout`. */
  readonly code: string;
  /** HTTP status when the daemon answered. */
  readonly status: number | undefined;

  constructor(message: string, options: { code?: string; status?: number; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? (new.target as typeof ZygoteError).defaultCode;
    this.status = options.status;
  }
}

/** The daemon could not be reached (not running, wrong URL, TLS failure). */
export class ConnectionFailed extends ZygoteError {
  static override readonly defaultCode: string = "connection_failed";
}
/** The daemon did not answer within the client's timeout. */
export class RequestTimeout extends ZygoteError {
  static override readonly defaultCode: string = "request_timeout";
}
export class Unauthorized extends ZygoteError {
  static override readonly defaultCode: string = "unauthorized";
}
export class InvalidArgument extends ZygoteError {
  static override readonly defaultCode: string = "invalid_argument";
}
export class NotFoundError extends ZygoteError {
  static override readonly defaultCode: string = "not_found";
}
export class SandboxNotFound extends NotFoundError {}
export class SnapshotNotFound extends NotFoundError {}
/** A path inside the guest does not exist. */
export class FileNotFound extends NotFoundError {
  static override readonly defaultCode: string = "guest_not_found";
}
/** No background process with that pid in the sandbox. */
export class ProcessNotFound extends NotFoundError {}
export class ConflictError extends ZygoteError {
  static override readonly defaultCode: string = "conflict";
}
/** The background process has exited: it takes no more stdin or signals. */
export class ProcessExited extends ConflictError {
  static override readonly defaultCode: string = "process_exited";
}
export class SandboxNotRunning extends ConflictError {
  static override readonly defaultCode: string = "sandbox_not_running";
}
/**
 * The sandbox is paused: `resume()` it first (or create it with
 * `autoResume: true` so that commands and file calls resume it).
 */
export class SandboxPaused extends SandboxNotRunning {
  static override readonly defaultCode: string = "sandbox_paused";
}
/** Pause of a sandbox that is not running, or resume of one that is not paused. */
export class WrongState extends ConflictError {
  static override readonly defaultCode: string = "wrong_state";
}
/** Another branch, snapshot, restore or delete is in progress on it. */
export class SandboxBusy extends ConflictError {
  static override readonly defaultCode: string = "sandbox_busy";
}
export class SnapshotInUse extends ConflictError {
  static override readonly defaultCode: string = "snapshot_in_use";
}
export class PermissionDenied extends ZygoteError {
  static override readonly defaultCode: string = "guest_permission_denied";
}
export class PayloadTooLarge extends ZygoteError {
  static override readonly defaultCode: string = "payload_too_large";
}
/** The runtime cannot do this (e.g. a snapshot kind it lacks). */
export class Unsupported extends ZygoteError {
  static override readonly defaultCode: string = "unsupported";
}
/** The program could not be started in the guest. */
export class SpawnFailed extends ZygoteError {
  static override readonly defaultCode: string = "guest_spawn_failed";
}
/** The daemon or the guest agent failed (5xx). */
export class ServerError extends ZygoteError {
  static override readonly defaultCode: string = "internal";
}
/**
 * The registry has no such image or snapshot pack (`image_not_found`): a wrong
 * repository, tag or digest, or one the credentials may not see.
 */
export class ImageNotFound extends NotFoundError {
  static override readonly defaultCode: string = "image_not_found";
}
/**
 * The registry refused the credentials, or wants some (`registry_unauthorized`,
 * HTTP 403: the API token itself is fine). Pass `username`/`password`, or log
 * the daemon's user in (its docker config).
 */
export class RegistryUnauthorized extends ZygoteError {
  static override readonly defaultCode: string = "registry_unauthorized";
}
/** The image or snapshot pack cannot be used (`bad_image`): a digest mismatch, a hostile layer, not a pack. */
export class BadImage extends ZygoteError {
  static override readonly defaultCode: string = "bad_image";
}
/** The image has no linux/amd64 variant (`unsupported_platform`; the message names those it has). */
export class UnsupportedPlatform extends ZygoteError {
  static override readonly defaultCode: string = "unsupported_platform";
}
/** The image is over one of the daemon's size limits (`image_too_large`). */
export class ImageTooLarge extends ZygoteError {
  static override readonly defaultCode: string = "image_too_large";
}
/** The registry failed or could not be reached (`registry_error`, 502). */
export class RegistryError extends ServerError {
  static override readonly defaultCode: string = "registry_error";
}

/** The command ran past its timeout and was killed; `result` has its output so far. */
export class CommandTimeout extends ZygoteError {
  static override readonly defaultCode: string = "command_timeout";
  constructor(
    message: string,
    readonly result: CommandResult,
  ) {
    super(message);
  }
}

/** `run(..., { check: true })` and the command did not exit 0. */
export class CommandFailed extends ZygoteError {
  static override readonly defaultCode: string = "command_failed";
  constructor(
    message: string,
    readonly result: CommandResult,
  ) {
    super(message);
  }
}

/**
 * `branch()` brought up only some of the requested children. `children` are
 * the ones that run (use or kill them), `failures` say which did not and why
 * (the daemon left nothing of those), `parent` is the branched sandbox's id.
 * `branch({ allowPartial: true })` returns the running children instead.
 */
export class BranchIncompleteError extends ZygoteError {
  static override readonly defaultCode: string = "branch_incomplete";
  constructor(
    message: string,
    readonly parent: string,
    readonly children: Sandbox[],
    readonly failures: BranchFailure[],
  ) {
    super(message);
  }
}

/**
 * `merge()` stopped because both sandboxes changed the same paths differently
 * since their common branch point (`onConflict: "fail"`): nothing was changed.
 * `report` is the daemon's {@link MergeReport} (what the merge would have
 * changed, and why it did not), `conflicts` its conflicts. Merge again with
 * `onConflict: "theirs"` or `"ours"` to settle them.
 */
export class MergeConflictError extends ZygoteError {
  static override readonly defaultCode: string = "merge_conflict";
  constructor(
    message: string,
    readonly report: MergeReport,
  ) {
    super(message);
  }

  get conflicts(): MergeConflict[] {
    return this.report.conflicts;
  }
}

type ErrorClass = new (message: string, options?: { code?: string; status?: number }) => ZygoteError;

const BY_CODE: Record<string, ErrorClass> = {
  unauthorized: Unauthorized,
  malformed_body: InvalidArgument,
  invalid_argument: InvalidArgument,
  guest_bad_request: InvalidArgument,
  method_not_allowed: InvalidArgument,
  route_not_found: NotFoundError,
  guest_not_found: FileNotFound,
  sandbox_not_running: SandboxNotRunning,
  sandbox_busy: SandboxBusy,
  sandbox_paused: SandboxPaused,
  wrong_state: WrongState,
  snapshot_in_use: SnapshotInUse,
  process_exited: ProcessExited,
  guest_busy: ConflictError,
  conflict: ConflictError,
  guest_already_exists: ConflictError,
  guest_permission_denied: PermissionDenied,
  payload_too_large: PayloadTooLarge,
  guest_response_too_large: PayloadTooLarge,
  unsupported: Unsupported,
  guest_spawn_failed: SpawnFailed,
  image_not_found: ImageNotFound,
  registry_unauthorized: RegistryUnauthorized,
  bad_image: BadImage,
  unsupported_platform: UnsupportedPlatform,
  image_too_large: ImageTooLarge,
  registry_error: RegistryError,
  // The code interpreter (runCode and its contexts).
  code_context_not_found: NotFoundError,
  no_code_interpreter: Unsupported,
  code_envs_unsupported: Unsupported,
  code_context_limit: ConflictError,
};

const SERVER_CODES = new Set([
  "internal",
  "runtime_error",
  "image_error",
  "agent_unreachable",
  "guest_error",
  "code_server_error",
  "code_server_malformed",
]);

/**
 * The error for an API `code`. The daemon uses one `not_found` code for every
 * kind of missing object and words the message `<kind> "<id>" not found`; the
 * kind picks {@link SandboxNotFound} or {@link SnapshotNotFound}.
 */
export function errorFor(code: string, message: string, status?: number): ZygoteError {
  let cls: ErrorClass;
  if (code === "not_found") {
    cls = message.startsWith("sandbox ")
      ? SandboxNotFound
      : message.startsWith("snapshot ")
        ? SnapshotNotFound
        : message.startsWith("process ")
          ? ProcessNotFound
          : NotFoundError;
  } else if (BY_CODE[code]) {
    cls = BY_CODE[code];
  } else if (SERVER_CODES.has(code) || (status !== undefined && status >= 500)) {
    cls = ServerError;
  } else {
    cls = ZygoteError;
  }
  return new cls(message, status === undefined ? { code } : { code, status });
}
