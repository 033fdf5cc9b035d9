//! [`HostMatrix`]: a row-major `rows × cols` matrix of f32 in host memory — what stages hand each other
//! (hidden states, logits). On the CPU path the model computes in it directly, the wire encodes from its
//! slice and decodes into it, and the sampler samples its rows in place; no tensor in between.

use crate::error::{ModelError, Result};

/// A row-major `rows × cols` f32 matrix; `data.len() == rows * cols` always holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl HostMatrix {
    /// `data` as `rows × cols`; an error unless it holds exactly that many values.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(ModelError::BadInput(format!(
                "{} values for a {rows} × {cols} matrix",
                data.len()
            )));
        }
        Ok(Self { rows, cols, data })
    }

    /// A `rows × cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// All values, row after row.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values, row after row, without a copy.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Row `i`, if there is one.
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        (i < self.rows).then(|| &self.data[i * self.cols..(i + 1) * self.cols])
    }

    /// Every row, to change in place.
    pub fn rows_mut(&mut self) -> impl Iterator<Item = &mut [f32]> {
        // A 0-column matrix has no values, so no chunk comes out whatever the chunk size.
        self.data.chunks_mut(self.cols.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_must_match_the_values() {
        let m = HostMatrix::new(2, 3, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(m.shape(), [2, 3]);
        assert_eq!(m.row(1), Some(&[4.0, 5.0, 6.0][..]));
        assert_eq!(m.row(2), None);
        assert!(HostMatrix::new(2, 3, vec![0.0; 5]).is_err());
        assert!(HostMatrix::new(usize::MAX, 2, vec![]).is_err());
        assert_eq!(HostMatrix::zeros(0, 7).into_data(), Vec::<f32>::new());
    }

    #[test]
    fn rows_change_in_place() {
        let mut m = HostMatrix::zeros(3, 2);
        for (i, row) in m.rows_mut().enumerate() {
            row[1] = i as f32;
        }
        assert_eq!(m.data(), [0.0, 0.0, 0.0, 1.0, 0.0, 2.0]);
    }
}
