//! The error type of the public API.

use std::fmt;

/// Malformed arguments at the kernel API boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// The row length is not a multiple of the format's block size.
    BadRowLength {
        format: &'static str,
        k: usize,
        block: usize,
    },
    /// A slice has the wrong length.
    BadSliceLength {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// The weights and the activations are not in matching formats.
    FormatMismatch {
        weights: &'static str,
        activations: &'static str,
    },
    /// A size computation overflowed `usize`.
    Overflow { what: &'static str },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadRowLength { format, k, block } => {
                write!(
                    f,
                    "row length {k} is not a multiple of the {format} block size {block}"
                )
            }
            Self::BadSliceLength {
                what,
                expected,
                actual,
            } => {
                write!(f, "{what} has {actual} elements, expected {expected}")
            }
            Self::FormatMismatch {
                weights,
                activations,
            } => {
                write!(
                    f,
                    "{weights} weights cannot be multiplied with {activations} activations"
                )
            }
            Self::Overflow { what } => write!(f, "size of {what} overflows"),
        }
    }
}

impl std::error::Error for KernelError {}

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
