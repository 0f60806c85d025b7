//! Integration tests against the real `dlock` binary.
