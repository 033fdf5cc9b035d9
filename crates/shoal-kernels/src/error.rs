//! The error type of the public API.

/// Malformed arguments at the kernel API boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The row length is not a multiple of the format's block size (256 for the K-quants).
    #[error("row length {k} is not a multiple of the {format} block size {block}")]
    BadRowLength {
        format: &'static str,
        k: usize,
        block: usize,
    },
    /// A slice has the wrong length.
    #[error("{what} has {actual} elements, expected {expected}")]
    BadSliceLength {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// The weights and the activations are not in matching formats.
    #[error("{weights} weights cannot be multiplied with {activations} activations")]
    FormatMismatch {
        weights: &'static str,
        activations: &'static str,
    },
    /// A size computation overflowed `usize`.
    #[error("size of {what} overflows")]
    Overflow { what: &'static str },
}

/// Returns `BadSliceLength` unless `actual == expected`.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), KernelError> {
    if expected == actual {
        Ok(())
    } else {
        Err(KernelError::BadSliceLength {
            what,
            expected,
            actual,
        })
    }
}
