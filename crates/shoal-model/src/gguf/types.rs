//! The ggml tensor type ids a GGUF file may name: each id's name (as llama.cpp prints it), the candle
//! [`GgmlDType`] it corresponds to, if any, and whether shoal loads it ([`GgmlType::layout`]: the types
//! shoal-kernels multiply — [`QType::from_ggml_type_id`], the IQ formats and MXFP4 included — and the
//! other candle types). The header reader looks every tensor's type up here, so a file with a type shoal
//! cannot load fails at open with the type's name ("TQ2_0 (id 35)"), not a number.

use candle_core::quantized::GgmlDType;
use shoal_kernels::QType;

/// One ggml tensor type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    /// The id stored in a GGUF tensor info.
    pub id: u32,
    /// llama.cpp's name for it (`Q4_K`, `IQ4_XS`, ...).
    pub name: &'static str,
    /// The candle dtype of the same layout; `None` for the types candle lacks (IQ types, MXFP4, integer
    /// tensors, removed types).
    pub dtype: Option<GgmlDType>,
}

impl GgmlType {
    /// The kernels' format for this type, if they multiply it.
    pub fn qtype(&self) -> Option<QType> {
        QType::from_ggml_type_id(self.id)
    }

    /// `(values per block, bytes per block)` of a type shoal loads; `None` for the others.
    pub fn layout(&self) -> Option<(u64, u64)> {
        match (self.qtype(), self.dtype) {
            (Some(q), _) => Some((q.block_size() as u64, q.type_size() as u64)),
            (None, Some(d)) => Some((d.block_size() as u64, d.type_size() as u64)),
            (None, None) => None,
        }
    }
}

const fn t(id: u32, name: &'static str, dtype: Option<GgmlDType>) -> GgmlType {
    GgmlType { id, name, dtype }
}

/// Every type id ggml has defined, in id order (ids 4, 5, 31-33 and 36-38 are types ggml has since removed).
static TYPES: &[GgmlType] = &[
    t(0, "F32", Some(GgmlDType::F32)),
    t(1, "F16", Some(GgmlDType::F16)),
    t(2, "Q4_0", Some(GgmlDType::Q4_0)),
    t(3, "Q4_1", Some(GgmlDType::Q4_1)),
    t(4, "Q4_2", None),
    t(5, "Q4_3", None),
    t(6, "Q5_0", Some(GgmlDType::Q5_0)),
    t(7, "Q5_1", Some(GgmlDType::Q5_1)),
    t(8, "Q8_0", Some(GgmlDType::Q8_0)),
    t(9, "Q8_1", Some(GgmlDType::Q8_1)),
    t(10, "Q2_K", Some(GgmlDType::Q2K)),
    t(11, "Q3_K", Some(GgmlDType::Q3K)),
    t(12, "Q4_K", Some(GgmlDType::Q4K)),
    t(13, "Q5_K", Some(GgmlDType::Q5K)),
    t(14, "Q6_K", Some(GgmlDType::Q6K)),
    t(15, "Q8_K", Some(GgmlDType::Q8K)),
    t(16, "IQ2_XXS", None),
    t(17, "IQ2_XS", None),
    t(18, "IQ3_XXS", None),
    t(19, "IQ1_S", None),
    t(20, "IQ4_NL", None),
    t(21, "IQ3_S", None),
    t(22, "IQ2_S", None),
    t(23, "IQ4_XS", None),
    t(24, "I8", None),
    t(25, "I16", None),
    t(26, "I32", None),
    t(27, "I64", None),
    t(28, "F64", None),
    t(29, "IQ1_M", None),
    t(30, "BF16", Some(GgmlDType::BF16)),
    t(31, "Q4_0_4_4", None),
    t(32, "Q4_0_4_8", None),
    t(33, "Q4_0_8_8", None),
    t(34, "TQ1_0", None),
    t(35, "TQ2_0", None),
    t(36, "IQ4_NL_4_4", None),
    t(37, "IQ4_NL_4_8", None),
    t(38, "IQ4_NL_8_8", None),
    t(39, "MXFP4", None),
    t(40, "NVFP4", None),
    t(41, "Q1_0", None),
    t(42, "Q2_0", None),
];

/// The type with GGUF id `id`, `None` for an id ggml never defined.
pub fn ggml_type(id: u32) -> Option<&'static GgmlType> {
    TYPES.get(usize::try_from(id).ok()?)
}

/// The type shoal loads as `dtype` (each candle dtype has exactly one id).
pub fn ggml_type_of(dtype: GgmlDType) -> Option<&'static GgmlType> {
    TYPES.iter().find(|t| t.dtype == Some(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_positions_and_names_are_unique() {
        for (i, t) in TYPES.iter().enumerate() {
            assert_eq!(t.id as usize, i, "{}", t.name);
            assert_eq!(TYPES.iter().filter(|u| u.name == t.name).count(), 1);
        }
        assert_eq!(ggml_type(23).map(|t| t.name), Some("IQ4_XS"));
        assert_eq!(ggml_type(12).and_then(|t| t.dtype), Some(GgmlDType::Q4K));
        assert!(ggml_type(43).is_none());
        assert!(ggml_type(u32::MAX).is_none());
    }

    #[test]
    fn layouts_agree_with_candle_and_the_kernels() {
        for t in TYPES {
            if let (Some(q), Some(d)) = (t.qtype(), t.dtype) {
                assert_eq!(
                    (q.block_size(), q.type_size()),
                    (d.block_size(), d.type_size())
                );
            }
            assert_eq!(
                t.layout().is_some(),
                t.qtype().is_some() || t.dtype.is_some()
            );
        }
        for q in QType::ALL.into_iter().chain(QType::IQ) {
            let t = ggml_type(q.ggml_type_id()).expect("a ggml id");
            assert_eq!((t.name, t.qtype()), (q.name(), Some(q)));
        }
        assert_eq!(ggml_type(23).and_then(GgmlType::layout), Some((256, 136)));
        assert_eq!(ggml_type(39).and_then(GgmlType::layout), Some((32, 17)));
        assert_eq!(ggml_type(35).and_then(GgmlType::layout), None); // TQ2_0
    }

    #[test]
    fn every_candle_dtype_has_its_ggml_id() {
        use GgmlDType::*;
        let all = [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K,
        ];
        for d in all {
            let ids: Vec<u32> = TYPES
                .iter()
                .filter(|t| t.dtype == Some(d))
                .map(|t| t.id)
                .collect();
            assert_eq!(ids.len(), 1, "{d:?} has ids {ids:?}");
            assert_eq!(ggml_type_of(d).map(|t| t.id), Some(ids[0]));
        }
    }
}
