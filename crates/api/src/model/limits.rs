//! Limits on what one request may ask for: the API's bounds, checked by validation
//! (and by nothing after it: the daemon relies on them).
/// Sandboxes of one create (where each VM holds its own copy of its memory, also bounded
/// by what the host has: `Manager::begin_create`).
pub const MAX_FAN_OUT: u32 = 256;
/// Guest RAM when a create request names none.
pub const DEFAULT_MEM_MIB: u32 = 256;
/// Children of one branch (where children copy their parent's memory, also bounded by
/// what the host has: `Manager::begin_branch`).
pub const MAX_BRANCH_COUNT: u32 = 256;
pub const MIN_MEM_MIB: u32 = 64;
pub const MAX_MEM_MIB: u32 = 65536;
pub const MAX_VCPUS: u32 = 32;
pub const MAX_ARGV: usize = 4096;
pub const MAX_EXEC_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// Largest body accepted by `PUT .../files` (the largest request body of any route).
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;
/// Largest JSON request body. Only an exec comes near it: it must fit the guest
/// agent's 16 MiB frame once re-encoded (checked exactly by its validation), and
/// twice that leaves room for JSON escapes in the body (a newline in stdin takes
/// two bytes) while a body no exec could fit is refused before it is read.
pub const MAX_JSON_BODY_BYTES: usize = 2 * zygote_proto::MAX_FRAME_LEN;
pub const MAX_STDIN_BYTES: usize = 8 * 1024 * 1024;
