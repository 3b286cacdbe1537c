//! Measurements of loaders and staged copies
