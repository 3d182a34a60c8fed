/** One device: its variables live with their stamps, history, commands and firmware (to be built). */
export function Device({ id }: { id: string }) {
  return (
    <main>
      <h1>Device {id}</h1>
    </main>
  );
}
