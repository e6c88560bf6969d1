//! A certificate authority of the test's own, for servers that speak TLS
//! only.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority generated for one test.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A self-signed CA with the common name `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate in a PEM file of its own (for a client that takes
    /// a path), removed when the returned value is dropped.
    pub fn pem_file(&self, name: &str) -> TempFile {
        TempFile::new(name, self.pem().as_bytes())
    }

    /// A certificate for a server at 127.0.0.1 and localhost named
    /// `common_name`, and its private key, PEM.
    pub fn server(&self, common_name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &*self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A file removed when dropped.
pub struct TempFile(PathBuf);

impl TempFile {
    /// Writes `contents` to a file of the temporary directory named after
    /// this process and `name`.
    pub fn new(name: &str, contents: &[u8]) -> TempFile {
        let path =
            std::env::temp_dir().join(format!("ratewarden-test-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).expect("write a temporary file");
        TempFile(path)
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temporary path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
